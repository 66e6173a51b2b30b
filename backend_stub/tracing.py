"""The backend's spans: its API requests, each worker run of an export, and each callback delivery.

The gateway is the backend's only caller, so its sampled flag is obeyed (parent
based). A task keeps the `traceparent` of the request that created it: the
worker's run and every callback delivery join that trace, so a task's whole life
is one trace; a re-run keeps the trace and links to the request that asked for it.
A `traceparent` is read by OpenTelemetry's W3C propagator: one that is not well
formed is ignored. With no exporter nothing here builds a span. A span never carries a query's values (a
signed download's `sig` is its credential) nor the service token, whatever headers an operator asks it to capture.
"""
from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Sequence

from opentelemetry import context, propagate, trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link
from opentelemetry.util.http import OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS, get_custom_headers
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from backend_stub.models import Task
from exports_common import otel
from exports_common.contract import Status
from exports_common.otel import TracingConfig


class _Tracer:
    """The process's tracer, a no-op one until `setup` finds an exporter, and whether its sampler follows a
    caller's sampled flag."""

    current: trace.Tracer = trace.NoOpTracer()
    parent_based = True


_last_step: ContextVar[str | None] = ContextVar("export_step", default=None)


def setup(config: TracingConfig) -> None:
    resolved = otel.from_environment(config)
    if resolved.exporter != "none":
        # the stable HTTP attribute names the gateway's spans carry (http.request.method, url.path...), unless the
        # operator chose otherwise: read once, by the first instrumentation built
        os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
        _Tracer.current = otel.install("backend", resolved).provider.get_tracer("backend")
        _Tracer.parent_based = resolved.sampler.startswith("parentbased")


def _context_of(traceparent: str | None) -> context.Context | None:
    return propagate.extract({"traceparent": traceparent}) if traceparent else None


def _link(traceparent: str | None) -> list[Link]:
    parent = trace.get_current_span(_context_of(traceparent)).get_span_context() if traceparent else None
    return [Link(parent, {"gateway.link": "rerun request"})] if parent is not None and parent.is_valid else []


def extra(incoming: str | None, key: str = "traceparent") -> dict[str, str]:
    """What a task keeps of the request's trace: this server span when it records, else the caller's traceparent
    (sent on to its callback receiver, so only a well-formed one is kept)."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().is_recording():
        propagate.inject(carrier)
    elif incoming:
        propagate.inject(carrier, _context_of(incoming))
    return {key: carrier["traceparent"]} if "traceparent" in carrier else {}


def _route_of(routes: Sequence[Route]) -> Callable[[Scope], tuple[str, dict[str, str]]]:
    """The span's name and `http.route`, known before the request is served: the template of the route Starlette
    will choose (the first full match, else the first whose path matches: a 405), else the method alone (a path
    nothing serves makes no name of its own)."""
    def details(scope: Scope) -> tuple[str, dict[str, str]]:
        found: str | None = None
        for route in routes:
            match, _ = route.matches(scope)
            if match is Match.FULL or (match is Match.PARTIAL and found is None):
                found = route.path
                if match is Match.FULL:
                    break
        return (f"{scope['method']} {found}", {"http.route": found}) if found else (scope["method"], {})

    return details


def _unsampled(scope: Scope) -> bool:
    """Whether the caller's `traceparent` is a W3C context whose sampled flag (the trace-flags' 0x01 bit) is not
    set: a parent-based sampler records nothing under it. A malformed one is no context: the ratio decides."""
    for name, value in scope["headers"]:
        if name == b"traceparent":
            parent = trace.get_current_span(_context_of(value.decode("latin-1"))).get_span_context()
            return parent.is_valid and not parent.trace_flags.sampled
    return False


class _UnsampledPassed:
    """OpenTelemetry's middleware for a request that may record; the app alone, nothing built, for one whose
    caller's trace is not sampled: most calls at a 5 % ratio, for which the middleware's request attributes, context
    and non-recording span would add more than half again to its instructions (benchmarks/RESULTS.md)."""

    def __init__(self, app: ASGIApp, instrumented: ASGIApp) -> None:
        self.app, self.instrumented = app, instrumented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _unsampled(scope):
            await self.app(scope, receive, send)
        else:
            await self.instrumented(scope, receive, send)


# the request's attributes that hold its query: the stable one, and the old ones an operator's
# OTEL_SEMCONV_STABILITY_OPT_IN may ask for (the middleware redacts a few names in `http.url` only)
_QUERY_HOLDERS = ("url.query", "http.target", "http.url")


def _names_only(query: str) -> str:
    """The query with each value replaced: `expires=REDACTED&sig=REDACTED`; a part without `=` may be a bare
    secret, so it is replaced whole."""
    return "&".join(f"{name}=REDACTED" if sep else "REDACTED"
                    for name, sep, _ in (part.partition("=") for part in query.split("&")))


def _without_query_values(span: trace.Span, scope: Scope) -> None:
    """The middleware's request hook, run after it set the request's attributes and before the app: each that holds
    the query is set again with the query's names only."""
    query = scope.get("query_string", b"").decode("latin-1")
    if not query or not isinstance(span, ReadableSpan) or span.attributes is None:
        return
    for key in _QUERY_HOLDERS:
        held = span.attributes.get(key)
        if isinstance(held, str):
            kept = "" if key == "url.query" else held.partition("?")[0] + "?"
            span.set_attribute(key, kept + _names_only(query))


def _sanitized_headers() -> list[str]:
    """The request headers whose captured value is `[REDACTED]`: the operator's, and always the service token."""
    return [*get_custom_headers(OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS), "authorization"]


def instrumented(app: ASGIApp, routes: Sequence[Route]) -> ASGIApp:
    """`app` with a server span per API request, a child of the caller's trace (OpenTelemetry's ASGI middleware,
    its HTTP metrics left out: the backend's are Prometheus'); `app` as it is when nothing is exported."""
    if isinstance(_Tracer.current, trace.NoOpTracer):
        return app
    middleware = OpenTelemetryMiddleware(app, default_span_details=_route_of(routes), tracer=_Tracer.current,
                                         meter=NoOpMeter("backend"), exclude_spans=["receive", "send"],
                                         server_request_hook=_without_query_values,
                                         http_capture_headers_sanitize_fields=_sanitized_headers())
    return _UnsampledPassed(app, middleware) if _Tracer.parent_based else middleware


@contextlib.contextmanager
def export_run(task: Task) -> Iterator[trace.Span]:
    """The worker's run of one attempt, in the task's trace; a re-run links to the request that asked for it."""
    if isinstance(_Tracer.current, trace.NoOpTracer):
        yield trace.INVALID_SPAN
        return
    parent = _context_of(task.extra.get("traceparent"))
    token = _last_step.set(None)
    try:
        with _Tracer.current.start_as_current_span(
                f"export {task.export_type}", context=parent or context.Context(), kind=trace.SpanKind.CONSUMER,
                links=_link(task.extra.get("rerun_traceparent")),
                attributes={"export.task_id": task.task_id, "export.type": task.export_type,
                            "export.attempt": task.attempt, "export.tenant": task.tenant}) as span:
            yield span
    finally:
        _last_step.reset(token)


def step(name: str | None) -> None:
    """An event on the export's span when its step changes (query, render, upload...)."""
    if name is not None and name != _last_step.get() and (span := trace.get_current_span()).is_recording():
        _last_step.set(name)
        span.add_event("step", {"export.step": name})


def ended(status: str, rows: int | None) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        attributes: dict[str, Any] = {"export.status": status}
        if rows is not None:
            attributes["export.rows"] = rows
        span.set_attributes(attributes)
        if status != Status.COMPLETED:
            span.set_status(trace.StatusCode.ERROR, status)


@contextlib.contextmanager
def callback_delivery(task: Task, seq: int, attempt: int) -> Iterator[dict[str, str]]:
    """A span per delivery try in the task's trace; yields the trace headers the receiver gets."""
    stored = task.extra.get("traceparent")
    if isinstance(_Tracer.current, trace.NoOpTracer):
        yield {"traceparent": stored} if stored else {}
        return
    with _Tracer.current.start_as_current_span(
            "callback", context=_context_of(stored) or context.Context(), kind=trace.SpanKind.PRODUCER,
            attributes={"export.task_id": task.task_id, "callback.seq": seq, "callback.try": attempt}):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier
