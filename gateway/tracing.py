"""The gateway's spans: a server span per sampled request, a client span per upstream try.

A request that will not be recorded costs no more than with tracing off: no SDK
span and no OpenTelemetry context are built for it. A new trace gets fresh ids in
a context variable, made into a `traceparent` only if a call leaves the gateway
(`inject`); a cache hit never builds one. Only a sampled request gets SDK spans,
so exporting at the default ratio adds work to one request in twenty.

A client's sampled flag is obeyed only from a trusted proxy (or with the
`parentbased_always_on` sampler): anyone else keeps their trace id, and the ratio
decides, so a hostile client cannot have every request traced.
"""
from __future__ import annotations

import contextlib
import random
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from opentelemetry import context, propagate, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from exports_common import otel
from exports_common.otel import TracingConfig

# a request whose trace is not recorded: its (trace id, span id), made into a traceparent
# only when a call leaves the gateway
_fresh_ids: ContextVar[tuple[int, int] | None] = ContextVar("fresh_trace_ids", default=None)


@dataclass(frozen=True)
class ServerTrace:
    trace_id: str  # 32 hex digits, for the logs
    span: trace.Span  # INVALID_SPAN when nothing records: setting attributes on it does nothing


def inject(carrier: dict[str, str]) -> None:
    """W3C trace headers for a call out of the gateway, whichever way the request is traced."""
    if (ids := _fresh_ids.get()) is not None:
        carrier["traceparent"] = f"00-{ids[0]:032x}-{ids[1]:016x}-00"
        return
    propagate.inject(carrier)


class Tracing:
    def __init__(self, tracer: trace.Tracer, config: TracingConfig) -> None:
        self.tracer = tracer
        self.config = config
        self.recording = config.exporter != "none"

    def _client_context(self, headers: Mapping[str, str], client: tuple[str, int] | None) -> SpanContext | None:
        if "traceparent" not in headers:
            return None
        parent = trace.get_current_span(propagate.extract(headers)).get_span_context()
        if not parent.is_valid:
            return None
        if self.config.trusts(client[0] if client else None):
            return parent
        sampled = otel.new_trace_sampled(self.config, parent.trace_id)
        return SpanContext(parent.trace_id, parent.span_id, is_remote=True, trace_state=parent.trace_state,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT))

    @contextlib.contextmanager
    def server(self, name: str, headers: Mapping[str, str], attributes: dict[str, Any],
               client: tuple[str, int] | None = None) -> Iterator[ServerTrace]:
        parent = self._client_context(headers, client)
        if parent is None:
            trace_id = random.getrandbits(128) or 1
            if not (self.recording and otel.new_trace_sampled(self.config, trace_id)):
                fresh = _fresh_ids.set((trace_id, random.getrandbits(64) or 1))
                try:
                    yield ServerTrace(f"{trace_id:032x}", trace.INVALID_SPAN)
                finally:
                    _fresh_ids.reset(fresh)
                return
            # sampled here, so the SDK's sampler records every root span (otel.install(presampled=True))
            with self._span(name, context.Context(), attributes) as request_trace:
                yield request_trace
            return
        if self.recording and parent.trace_flags.sampled:
            with self._span(name, trace.set_span_in_context(NonRecordingSpan(parent)), attributes) as request_trace:
                yield request_trace
            return
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
        try:
            yield ServerTrace(trace.format_trace_id(parent.trace_id), trace.INVALID_SPAN)
        finally:
            context.detach(token)

    @contextlib.contextmanager
    def _span(self, name: str, parent: context.Context, attributes: dict[str, Any]) -> Iterator[ServerTrace]:
        with self.tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                               attributes=attributes) as span:
            yield ServerTrace(trace.format_trace_id(span.get_span_context().trace_id), span)

    @contextlib.contextmanager
    def client(self, name: str, attributes: Callable[[], dict[str, Any]]) -> Iterator[trace.Span]:
        """A span for a call out, under the request's when that one records (`attributes` is called only then)."""
        current = trace.get_current_span()
        if not current.is_recording():
            yield current
            return
        with self.tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes()) as span:
            yield span


def setup_tracing(service_name: str, config: TracingConfig) -> Tracing:
    resolved = otel.from_environment(config)
    return Tracing(otel.install(service_name, resolved, presampled=True), resolved)
