"""The gateway's spans: a server span per sampled request, a client span per upstream try or outbox delivery.

A request that will not be recorded costs no more than with tracing off: no span
and no OpenTelemetry context are built for it. A new trace gets fresh ids, made
into a `traceparent` only if a call leaves the gateway (`inject`); a cache hit
never builds one. The request's trace is found where its log lines find its ids:
one context variable set once per request (`ServerTrace`).

Whether a request records is decided here, before any span exists (the ratio, and
which callers' sampled flag counts); a recorded request's spans are the SDK
tracer's, ended into the process's span processor (batched and exported as
OTEL_BSP_* say).

A client's sampled flag is obeyed only from a trusted proxy (or with the
`parentbased_always_on` sampler): anyone else keeps their trace id, and the ratio
decides, so a hostile client cannot have every request traced.
"""
from __future__ import annotations

import contextlib
import random
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from exports_common import otel
from exports_common.jsonlog import request_ids_var
from exports_common.otel import TracingConfig

_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_LOW_64 = TraceIdRatioBased.TRACE_ID_LIMIT  # the bits of a trace id the ratio decides on


class SpanLike(Protocol):
    """What call sites do with a span; `trace.INVALID_SPAN` when nothing records."""

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None: ...

    def end(self) -> None: ...


# a trace: the fresh trace id of an unrecorded new trace (no object built for it), a caller's unrecorded context
# passed on as it came, or the span being recorded
_Trace = int | SpanContext | trace.Span | None
# the trace of a call being made (a client span, a delivery); None: the request's (`_joined`)
_current: ContextVar[_Trace] = ContextVar("gateway_trace", default=None)
_NOT_RECORDED = contextlib.nullcontext(trace.INVALID_SPAN)  # a call out of a request that is not recorded


class _Recording:
    """A recorded span while a call is made: entered, it is the current trace (the one calls out join); left, it
    ends."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def __enter__(self) -> trace.Span:
        self.token: Token[_Trace] = _current.set(self.span)
        return self.span

    def __exit__(self, *exc: object) -> None:
        _current.reset(self.token)
        self.span.end()


class ServerTrace:
    """A request's trace while it is served: its trace id and its span (`trace.INVALID_SPAN` when not recorded), and
    the ids its log lines carry.

    Entered, it is the request's (`request_ids_var`, set once: the logs read their ids there, the calls out their
    trace) for the rest of the request's task, so a line written while a stream runs still carries the ids. Left,
    its span ends and the calls out after it (a stream's) join no trace. It holds plain values and the span only:
    no reference back to the context it is in, which would make every request's objects a cycle for the garbage
    collector.
    """

    __slots__ = ("current", "request_id", "span", "task_id", "trace_int")

    def __init__(self, trace_int: int, span: SpanLike, current: _Trace, request_id: str | None,
                 task_id: str | None) -> None:
        self.trace_int, self.span, self.current = trace_int, span, current
        self.request_id, self.task_id = request_id, task_id

    @property
    def trace_id(self) -> str:
        """As logs write it: formatted only when a line is written (most requests write none)."""
        return f"{self.trace_int:032x}"

    def get(self, key: str) -> str | None:
        """An id for a log line, by name."""
        if key == "trace_id":
            return self.trace_id
        return self.request_id if key == "request_id" else self.task_id if key == "task_id" else None

    def __enter__(self) -> ServerTrace:
        request_ids_var.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.current = None
        if self.span is not trace.INVALID_SPAN:  # recorded
            self.span.end()


def _joined() -> _Trace:
    """The trace a call out joins: the call's own (a client span, a delivery), else the request's while it is
    served."""
    current = _current.get()
    if current is None:
        request = request_ids_var.get()
        if isinstance(request, ServerTrace):
            return request.current
    return current


def inject(carrier: dict[str, str]) -> None:
    """W3C trace headers for a call out of the gateway, whichever way the request is traced."""
    current = _joined()
    if current is None:
        return
    if isinstance(current, trace.Span):
        span_context: SpanContext = current.get_span_context()
    elif isinstance(current, SpanContext):
        span_context = current
    else:  # a new trace not recorded: its span id is made only now, when a call leaves the gateway
        carrier["traceparent"] = f"00-{current:032x}-{random.getrandbits(64) or 1:016x}-00"
        return
    carrier["traceparent"] = (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
                              f"{span_context.trace_flags:02x}")
    if span_context.trace_state:
        carrier["tracestate"] = span_context.trace_state.to_header()


def _remote(headers: Mapping[str, str]) -> SpanContext | None:
    """The span context a `traceparent` header names, if it is well formed."""
    if "traceparent" not in headers:
        return None
    found = trace.get_current_span(propagate.extract(headers)).get_span_context()
    return found if found.is_valid else None


class Tracing:
    def __init__(self, installed: otel.Installed, config: TracingConfig) -> None:
        self.config = config
        self.processor = installed.processor
        self.tracer = installed.provider.get_tracer("gateway")
        # a new trace records when its id's low 64 bits are under this bound
        self.bound = otel.new_trace_bound(config) if self.processor is not None else 0

    def _client_context(self, headers: Mapping[str, str] | None, client: tuple[str, int] | None
                        ) -> SpanContext | None:
        parent = _remote(headers) if headers is not None else None
        if parent is None:
            return None
        if self.config.sampler.startswith("parentbased") and self.config.trusts(client[0] if client else None):
            return parent
        return SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_state=parent.trace_state,
                           trace_flags=_SAMPLED if parent.trace_id & _LOW_64 < self.bound else _NOT_SAMPLED)

    def server(self, method: str, route: str, route_name: str, headers: Mapping[str, str] | None,
               client: tuple[str, int] | None = None, request_id: str | None = None,
               task_id: str | None = None) -> ServerTrace:
        """The request's trace, to be entered for as long as it is served; `headers` are the request's when it
        may continue a client's trace (None: it carries no traceparent). `request_id` and `task_id` are for its
        log lines.

        The span's name and attributes are made only for a request that is recorded.
        """
        parent = self._client_context(headers, client) if headers is not None else None
        if parent is None:
            trace_id = random.getrandbits(128) or 1
            if trace_id & _LOW_64 >= self.bound:
                return ServerTrace(trace_id, trace.INVALID_SPAN, trace_id, request_id, task_id)
            return self._recorded(method, route, route_name, None, request_id, task_id)
        if self.processor is None or not parent.trace_flags.sampled:
            return ServerTrace(parent.trace_id, trace.INVALID_SPAN, parent, request_id, task_id)
        return self._recorded(method, route, route_name, parent, request_id, task_id)

    def _recorded(self, method: str, route: str, route_name: str, parent: SpanContext | None,
                  request_id: str | None, task_id: str | None) -> ServerTrace:
        span = self._start(f"{method} {route}", SpanKind.SERVER, parent,
                           {"http.route": route, "gateway.route": route_name})
        return ServerTrace(span.get_span_context().trace_id, span, span, request_id, task_id)

    def client(self, name: str, attributes: Callable[[], dict[str, Any]]) -> AbstractContextManager[SpanLike]:
        """A span for a call out, under the request's when that one records (`attributes` is called only then)."""
        current = _joined()
        if not isinstance(current, trace.Span):
            return _NOT_RECORDED
        return _Recording(self._start(name, SpanKind.CLIENT, current.get_span_context(), attributes()))

    @contextlib.contextmanager
    def delivery(self, name: str, stored: Mapping[str, str], attributes: dict[str, Any]) -> Iterator[SpanLike]:
        """A call made later for an earlier request (an outboxed submit), in that request's trace.

        As OpenTelemetry's messaging conventions have it for one message: the span is
        a child of the request that queued the call and links to it. `inject` inside
        sends this span's context on (the stored one when it is not recorded).
        """
        parent = _remote(stored)
        if parent is None or self.processor is None or not parent.trace_flags.sampled:
            token = _current.set(parent)
            try:
                yield trace.INVALID_SPAN
            finally:
                _current.reset(token)
            return
        with _Recording(self._start(name, SpanKind.CLIENT, parent, attributes,
                                    links=(Link(parent, {"gateway.link": "queued by"}),))) as span:
            yield span

    def _start(self, name: str, kind: SpanKind, parent: SpanContext | None, attributes: dict[str, Any],
               links: Sequence[Link] = ()) -> trace.Span:
        """A recorded span (the decision to record was made before: the gateway's tracer samples every span)."""
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else Context()
        return self.tracer.start_span(name, context, kind, attributes, links)


def setup_tracing(service_name: str, config: TracingConfig) -> Tracing:
    resolved = otel.from_environment(config)
    return Tracing(otel.install(service_name, resolved, decided=ALWAYS_ON), resolved)
