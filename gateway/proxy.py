"""The last handler of every chain: sends the request upstream and streams the answer back.

Hop-by-hop headers are dropped both ways; the headers the upstream trusts
(tenant, task id, attempt) come only from plugins, never from the client, and
forwarding headers only from a trusted proxy.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from opentelemetry import trace

from exports_common.errors import ApiError, ErrorKind
from gateway import telemetry
from gateway.context import RequestContext
from gateway.forwarding import TrustedProxies, is_forwarding
from gateway.response import GatewayResponse
from gateway.services import Services, Upstream
from gateway.upstream import Endpoint, Timeouts, UpstreamError

# the socket timeouts, cut to the deadline, normally fire first; this only catches a slow drip
DEADLINE_SLACK_SEC = 0.25
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
# set by the gateway alone; a client's copy is dropped
GATEWAY_OWNED = frozenset({
    "x-tenant-id", "x-task-id", "x-gateway-attempt", "x-request-id", "authorization", "traceparent", "tracestate",
    "x-tenant-max-active-tasks",
})


_DROPPED_UPSTREAM = HOP_BY_HOP | GATEWAY_OWNED
_DROPPED_CLIENT = HOP_BY_HOP | {"date", "server"}


def _dropped(headers: list[tuple[str, str]], always: frozenset[str]) -> frozenset[str]:
    """`always`, plus the names a `Connection` header lists (hop-by-hop too); most requests have none."""
    named = {t.strip().lower() for k, v in headers if k == "connection" for t in v.split(",")}
    return always | named if named else always


def upstream_headers(ctx: RequestContext, trusted: TrustedProxies) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop, gateway-owned and (from an untrusted peer) forwarding ones.

    A name is judged with `_` read as `-`: servers such as uvicorn and WSGI ones fold
    `X_Tenant_Id` into `X-Tenant-Id`, so a client's underscore spelling must not slip by.
    """
    scope = ctx.request.scope
    incoming = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
    drop = _dropped(incoming, _DROPPED_UPSTREAM)
    from_proxy = trusted.trusts(scope)
    out, chain = [], ""
    for key, value in incoming:
        name = key.replace("_", "-")
        if name in drop or (is_forwarding(name) and not from_proxy):
            continue
        if name == "x-forwarded-for":
            chain = f"{value}, "
            continue
        out.append((key, value))
    client = ctx.request.client
    out += [
        ("x-forwarded-for", chain + (client.host if client else "")),
        ("x-request-id", ctx.request_id),
    ]
    if not from_proxy:
        out += [("x-forwarded-proto", scope.get("scheme", "http")),
                ("x-forwarded-host", ctx.request.headers.get("host", ""))]
    out += list(ctx.upstream_headers.items())
    carrier: dict[str, str] = {}
    telemetry.inject(carrier)
    out += list(carrier.items())
    return out


def client_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # the gateway's own server adds date and server
    drop = _dropped(headers, _DROPPED_CLIENT) - {"content-length"}
    return [(k, v) for k, v in headers if k not in drop]


class LimitedBody:
    """Streams a request body upstream, stopping it once it passes the route's limit."""

    def __init__(self, chunks: AsyncIterator[bytes], limit: int) -> None:
        self.chunks = chunks
        self.limit = limit
        self.exceeded = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.chunks:
            seen += len(chunk)
            if seen > self.limit:
                self.exceeded = True
                raise too_large(self.limit)
            yield chunk


def too_large(limit: int) -> ApiError:
    return ApiError(ErrorKind.PAYLOAD_TOO_LARGE, f"the body must be at most {limit} bytes")


class Proxy:
    def __init__(self, upstream: Upstream, services: Services, max_body_bytes: int) -> None:
        self.upstream = upstream
        self.services = services
        self.max_body_bytes = max_body_bytes

    def _body(self, ctx: RequestContext) -> bytes | LimitedBody | None:
        if ctx.body is not None:
            return ctx.body
        if ctx.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
            return None
        declared = ctx.request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large(self.max_body_bytes)
        return LimitedBody(ctx.request.stream(), self.max_body_bytes)

    def _timeouts(self, ctx: RequestContext) -> Timeouts:
        """Per-try bounds, cut to what is left of the request's total so a late try fails as a timeout."""
        timeouts = ctx.timeouts or self.upstream.timeouts
        if ctx.deadline is None:
            return timeouts
        left = ctx.deadline - time.monotonic()
        if left <= 0:
            raise UpstreamError("timeout", "the request's total time ran out before this try")
        return Timeouts(connect=min(timeouts.connect, left), read=min(timeouts.read, left))

    async def _send(self, ctx: RequestContext, url: str, body: bytes | LimitedBody | None) -> GatewayResponse:
        timeouts = self._timeouts(ctx)
        headers = upstream_headers(ctx, self.services.trusted_proxies)
        send = self.services.client.request(ctx.method, url, headers, body, timeouts)
        if ctx.deadline is None:
            return await send
        try:
            # socket timeouts bound each read; this bounds the try as a whole to the request's deadline
            async with asyncio.timeout_at(ctx.deadline + DEADLINE_SLACK_SEC):
                return await send
        except TimeoutError as exc:
            raise UpstreamError("timeout", "no answer within the route's total time") from exc

    async def _send_to(self, ctx: RequestContext, endpoint: Endpoint, url: str,
                       body: bytes | LimitedBody | None) -> GatewayResponse:
        """One try on one endpoint, telling its pool whether the connection could be made."""
        pool = self.upstream.pool
        endpoint.in_flight += 1
        try:
            resp = await self._send(ctx, url, body)
        except UpstreamError as exc:
            if exc.kind == "connect_error":
                pool.connect_failed(endpoint)
            raise
        finally:
            endpoint.in_flight -= 1
        pool.connected(endpoint)
        return resp

    def _span_attributes(self, ctx: RequestContext, url: str) -> dict[str, Any]:
        """What an SRE reads on an upstream try's span: which try, the breaker, why the last one was retried."""
        breaker = self.services.breakers.by_upstream.get(self.upstream.name)
        attributes: dict[str, Any] = {"http.request.method": ctx.method, "url.full": url,
                                      "http.request.resend_count": ctx.attempt - 1, "gateway.attempt": ctx.attempt,
                                      "gateway.breaker.state": breaker.state if breaker else "none"}
        if (reason := ctx.notes.get("retry_reason")) is not None:
            attributes["gateway.retry.reason"] = str(reason)
        return attributes

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        query = ctx.request.scope["query_string"].decode("latin-1") if ctx.query is None else ctx.query
        endpoint = self.upstream.pool.pick()
        url = f"{endpoint.url}{ctx.upstream_path}" + (f"?{query}" if query else "")
        body = self._body(ctx)
        started = time.perf_counter()
        with self.services.tracing.client(f"upstream {self.upstream.name}",
                                          lambda: self._span_attributes(ctx, url)) as span:
            try:
                resp = await self._send_to(ctx, endpoint, url, body)
            except Exception as exc:
                if isinstance(body, LimitedBody) and body.exceeded:
                    raise too_large(self.max_body_bytes) from exc
                span.set_status(trace.StatusCode.ERROR, str(exc))
                outcome = exc.kind if isinstance(exc, UpstreamError) else type(exc).__name__
                self.services.metrics.upstream_calls.add(self.upstream.name, ctx.route_name, outcome)
                raise
            finally:
                self.services.metrics.upstream_duration.record(time.perf_counter() - started,
                                                               self.upstream.name, ctx.route_name)
            span.set_attribute("http.response.status_code", resp.status)
        self.services.metrics.upstream_calls.add(self.upstream.name, ctx.route_name, str(resp.status))
        resp.headers = client_headers(resp.headers)
        return resp
