"""What one request carries through its route's plugin chain.

Plugins never import each other; this is how they cooperate. The fields below
the first block are the vocabulary of the plugin contract: a plugin declares
which of them it `needs` and `provides` (gateway/plugins/base.py), and the
route's chain is checked against those declarations when the config loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope

from exports_common.json_body import read_limited, too_large
from gateway.response import GatewayResponse
from gateway.upstream import Timeouts


def first_values(scope: Scope) -> dict[bytes, bytes]:
    """Each of the request's headers by name, its first value as sent (ASGI bytes, names in lower case): the
    value Starlette's `Headers.get` answers."""
    return dict(reversed(list(scope["headers"])))  # later pairs overwrite earlier ones: reversed, the first wins


@dataclass(slots=True)
class RequestContext:
    scope: Scope
    receive: Receive
    # `first_values(scope)`: what the gateway itself reads of every request (the API key, the request and trace
    # ids) is a dict lookup, and the `headers` mapping is made only for a plugin that asks for it
    header_values: dict[bytes, bytes]
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
    # the body once read (`read_body`); the proxy then sends these bytes instead of the stream
    body: bytes | None = None
    # the body parsed as JSON, by a plugin that checked it
    json: Any = None
    tenant: str | None = None
    # the tenant the API key names, or None: resolved once (TenantDirectory.caller) for rate_limit and auth
    caller: str | None = None
    caller_resolved: bool = False
    # the task this request names: from the path (task_id check), fixed by idempotency's claim, or minted by
    # task_id generate when no earlier plugin fixed it
    task_id: str | None = None
    # the route's upstream policy (timeout, retry), read by the proxy for each try: per-try bounds, the
    # monotonic deadline of the whole request, which try this is and why the one before it was retried
    timeouts: Timeouts | None = None
    deadline: float | None = None
    attempt: int = 1
    retry_reason: str | None = None
    # headers every answer to this request carries, whichever plugin produced it
    response_headers: dict[str, str] = field(default_factory=dict)
    # a task's state the gateway already holds (a change pushed by the upstream's feed): a route's answer
    # view (gateway/answer_view.py) answers with it instead of calling the upstream
    held: Any = None
    _request: Request | None = field(default=None, init=False, repr=False)
    _headers: Headers | None = field(default=None, init=False, repr=False)

    @property
    def headers(self) -> Headers:
        """The request's headers (Starlette's, over the scope), made the first time a plugin asks for them."""
        if self._headers is None:
            self._headers = Headers(scope=self.scope)
        return self._headers

    @property
    def request(self) -> Request:
        """Starlette's request (its body stream, query parameters), made the first time a plugin asks for it:
        most requests need only the scope and the headers."""
        if self._request is None:
            self._request = Request(self.scope, self.receive)
        return self._request

    async def read_body(self, limit: int) -> bytes:
        """The request body, read once whoever asks first; more than `limit` bytes is a 413.

        Every plugin that needs the body reads it here, so no plugin depends on
        another having read it (or on the stream being still unread).
        """
        if self.body is None:
            self.body = await read_limited(self.request.stream(), limit, self.headers.get("content-length"))
        elif len(self.body) > limit:
            raise too_large(limit)
        return self.body

    def tenant_key(self, param: str) -> str:
        """`<tenant>:<path parameter>`: what per-tenant stores of a task's answers are keyed by."""
        return f"{self.tenant or '-'}:{self.params.get(param, '')}"


Handler = Callable[[RequestContext], Awaitable[GatewayResponse]]
