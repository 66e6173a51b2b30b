"""What one request carries through its route's plugin chain.

Plugins never import each other; this is how they cooperate. Each reads and
writes only the fields it owns, named here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.requests import Request

from gateway.response import GatewayResponse
from gateway.upstream import Timeouts


@dataclass(slots=True)  # one per request: slots make it smaller and its fields quicker to reach
class RequestContext:
    request: Request
    method: str
    route_name: str
    upstream: str
    upstream_path: str
    params: dict[str, str]
    request_id: str
    # set by plugins, sent upstream by the proxy
    upstream_headers: dict[str, str] = field(default_factory=dict)
    # the query string sent upstream; None forwards the client's
    query: str | None = None
    # a plugin that reads the body keeps it here; the proxy then sends these bytes instead of the stream
    body: bytes | None = None
    json: Any = None
    tenant: str | None = None
    # the task this request names: from the path (task_id check), fixed by idempotency's claim, or minted by
    # task_id generate when no earlier plugin fixed it
    task_id: str | None = None
    # timeout plugin: per-try bounds and the monotonic deadline of the whole request
    timeouts: Timeouts | None = None
    deadline: float | None = None
    attempt: int = 1
    # headers every answer to this request carries, whichever plugin produced it
    response_headers: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def tenant_key(self, param: str) -> str:
        """`<tenant>:<path parameter>`: what per-tenant stores of a task's answers are keyed by."""
        return f"{self.tenant or '-'}:{self.params.get(param, '')}"


Handler = Callable[[RequestContext], Awaitable[GatewayResponse]]
