"""The last handler of every chain: sends the request upstream and streams the answer back.

Hop-by-hop headers are dropped both ways (gateway/headers.py); the headers the
upstream trusts (tenant, task id, attempt) come only from plugins, never from the
client, and forwarding headers only from a trusted proxy.
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator, Awaitable

from opentelemetry import trace

from exports_common.json_body import refuse_declared_over, too_large
from gateway.context import RequestContext
from gateway.headers import client_headers, upstream_headers
from gateway.response import GatewayResponse
from gateway.services import Services, Upstream
from gateway.upstream import DEFAULT_MAX_ANSWER_BYTES, Timeouts, UpstreamError

# the socket timeouts, cut to the deadline, normally fire first; the deadline itself catches a slow drip
DEADLINE_SLACK_SEC = 0.25


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


class Proxy:
    def __init__(self, upstream: Upstream, services: Services, max_body_bytes: int, breaker: str | None = None,
                 max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES) -> None:
        """`breaker`: the name of the breaker the route's calls go through, shown on each try's span.
        `max_answer_bytes`: the most of an answer a plugin may read whole."""
        self.upstream = upstream
        self.services = services
        self.max_body_bytes = max_body_bytes
        self.breaker = breaker
        self.max_answer_bytes = max_answer_bytes

    def _body(self, ctx: RequestContext) -> bytes | LimitedBody | None:
        if ctx.body is not None:
            return ctx.body
        if ctx.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
            return None
        refuse_declared_over(ctx.headers.get("content-length"), self.max_body_bytes)
        return LimitedBody(ctx.request.stream(), self.max_body_bytes)

    def _timeouts(self, ctx: RequestContext) -> Timeouts:
        """Per-try bounds, cut to what is left of the request's total so a late try fails as a timeout."""
        timeouts = ctx.timeouts or self.upstream.timeouts
        if ctx.deadline is None:
            return timeouts
        left = ctx.deadline - time.monotonic()
        if left <= 0:
            raise UpstreamError("timeout", "the request's total time ran out before this try")
        # each read is bounded by `read`; the deadline bounds the try as a whole (a slow drip, a wait for the pool)
        return Timeouts(connect=min(timeouts.connect, left), read=min(timeouts.read, left),
                        deadline=ctx.deadline + DEADLINE_SLACK_SEC)

    def _send(self, ctx: RequestContext, url: str, body: bytes | LimitedBody | None) -> Awaitable[GatewayResponse]:
        """The try's call, for the caller to await."""
        timeouts = self._timeouts(ctx)
        headers = upstream_headers(ctx, self.services.trusted_proxies)
        headers += self.upstream.auth
        return self.services.client.request(ctx.method, url, headers, body, timeouts)

    def _span_attributes(self, ctx: RequestContext, url: str) -> dict[str, Any]:
        """What an SRE reads on an upstream try's span: which try, the breaker, why the last one was retried."""
        breaker = self.services.breakers.by_upstream.get(self.breaker) if self.breaker is not None else None
        attributes: dict[str, Any] = {"http.request.method": ctx.method, "url.full": url,
                                      "http.request.resend_count": ctx.attempt - 1, "gateway.attempt": ctx.attempt,
                                      "gateway.breaker.state": breaker.state if breaker else "none"}
        if ctx.retry_reason is not None:
            attributes["gateway.retry.reason"] = ctx.retry_reason
        return attributes

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        query = ctx.scope["query_string"].decode("latin-1") if ctx.query is None else ctx.query
        pool = self.upstream.pool
        endpoint = pool.pick()
        url = f"{endpoint.url}{ctx.upstream_path}" + (f"?{query}" if query else "")
        body = self._body(ctx)
        metrics = self.services.metrics
        started = time.perf_counter()
        with self.services.tracing.client(f"upstream {self.upstream.name}",
                                          lambda: self._span_attributes(ctx, url)) as span:
            endpoint.in_flight += 1
            try:
                resp = await self._send(ctx, url, body)
            except Exception as exc:
                if isinstance(exc, UpstreamError) and exc.kind == "connect_error":  # the endpoint's pool is told
                    pool.connect_failed(endpoint)
                if isinstance(body, LimitedBody) and body.exceeded:
                    raise too_large(self.max_body_bytes) from exc
                span.set_status(trace.StatusCode.ERROR, str(exc))
                outcome = exc.kind if isinstance(exc, UpstreamError) else type(exc).__name__
                metrics.upstream_calls.add(self.upstream.name, ctx.route_name, outcome)
                raise
            finally:
                endpoint.in_flight -= 1
                metrics.upstream_duration.record(time.perf_counter() - started, self.upstream.name, ctx.route_name)
            pool.connected(endpoint)  # a call reached it
            span.set_attribute("http.response.status_code", resp.status)
        metrics.upstream_calls.add(self.upstream.name, ctx.route_name, str(resp.status))
        resp.headers = client_headers(resp.headers)
        resp.max_read = self.max_answer_bytes
        return resp
