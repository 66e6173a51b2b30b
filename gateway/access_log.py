"""The access log: one JSON line per answered request, when the config asks for it (`access_log: true`).

Written to the logger `gateway.access`, so it can be routed apart from the
operational log; the fields are those an SRE greps for at 3 a.m.
"""
from __future__ import annotations

import logging

from gateway.context import RequestContext
from gateway.response import GatewayResponse

log = logging.getLogger("gateway.access")


def write(ctx: RequestContext, resp: GatewayResponse, seconds: float, trace_id: str,
          events: int | None = None) -> None:
    """`events`: for an event stream, written when it ends, how many events it sent (and `duration_ms` is its life)."""
    client = ctx.scope.get("client")
    extra = {} if events is None else {"events": events}
    log.info("request", extra={**extra,
        "request_id": ctx.request_id, "trace_id": trace_id, "tenant": ctx.tenant, "route": ctx.route_name,
        "method": ctx.method, "path": ctx.scope["path"], "status": resp.status,
        "duration_ms": round(seconds * 1000, 3), "attempts": ctx.attempt, "cache": resp.header("x-cache"),
        "task_id": ctx.task_id or ctx.params.get("task_id"), "client": client[0] if client else None,
    })
