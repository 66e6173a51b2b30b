"""The backend's spans: its API requests, each worker run of an export, and each callback delivery.

The gateway is the backend's only caller, so its sampled flag is obeyed (parent
based). A task keeps the `traceparent` of the request that created it: the
worker's run and every callback delivery join that trace, so a task's whole life
is one trace; a re-run keeps the trace and links to the request that asked for it.
With no exporter nothing here builds a span.
"""
from __future__ import annotations

import contextlib
import re
from contextvars import ContextVar
from typing import Any, Iterator

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend_stub.models import Task
from exports_common import otel
from exports_common.contract import Status
from exports_common.otel import TracingConfig


class _Tracer:
    """The process's tracer, a no-op one until `setup` finds an exporter."""

    current: trace.Tracer = trace.NoOpTracer()


_last_step: ContextVar[str | None] = ContextVar("export_step", default=None)


def setup(config: TracingConfig) -> None:
    resolved = otel.from_environment(config)
    if resolved.exporter != "none":
        _Tracer.current = otel.install("backend", resolved)


def _context_of(traceparent: str | None) -> context.Context | None:
    return propagate.extract({"traceparent": traceparent}) if traceparent else None


def _link(traceparent: str | None) -> list[Link]:
    parent = trace.get_current_span(_context_of(traceparent)).get_span_context() if traceparent else None
    return [Link(parent, {"gateway.link": "rerun request"})] if parent is not None and parent.is_valid else []


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def extra(incoming: str | None, key: str = "traceparent") -> dict[str, str]:
    """What a task keeps of the request's trace: this server span when it records, else the caller's traceparent."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().is_recording():
        propagate.inject(carrier)
    # a client's header is sent on to its callback receiver: only a well-formed one is kept
    well_formed = incoming if incoming and _TRACEPARENT.fullmatch(incoming) else None
    value = carrier.get("traceparent", well_formed)
    return {key: value} if value else {}


def _unsampled(scope: Scope) -> bool:
    """A call whose caller does not record its trace: no span, nothing built (most calls at a 5% ratio)."""
    for name, value in scope["headers"]:
        if name == b"traceparent":
            return value.endswith(b"-00")
    return False


class TracingMiddleware:
    """A server span per API request, a child of the caller's trace."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or isinstance(_Tracer.current, trace.NoOpTracer) or _unsampled(scope):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with _Tracer.current.start_as_current_span(
                f"{scope['method']} {scope['path']}", context=propagate.extract(headers), kind=trace.SpanKind.SERVER,
                attributes={"http.request.method": scope["method"]}) as span:
            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, sending)
            if (route := scope.get("route")) is not None and hasattr(route, "path"):
                span.update_name(f"{scope['method']} {route.path}")
                span.set_attribute("http.route", route.path)


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
