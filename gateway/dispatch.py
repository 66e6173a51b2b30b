"""The per-request path: match a route, run its plugin chain, map what went wrong to an error envelope.

Everything here runs on the one Runtime that was in force when the request
arrived, so a reload never changes a request halfway through.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import re
import time

from opentelemetry.trace import INVALID_SPAN
from redis.exceptions import RedisError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

from exports_common.connection_limits import HEADER_BYTES_BOUND
from exports_common.errors import ApiError, ErrorKind, unavailable
from exports_common.redis_client import store_unavailable
from gateway import access_log
from gateway.context import RequestContext, first_values
from gateway.response import GatewayResponse
from gateway.runtime import Runtime
from gateway.upstream import AnswerTooLarge, UpstreamError

log = logging.getLogger("gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# nginx's status for a request whose client closed the connection first: counted, never sent
CLIENT_CLOSED = 499


@functools.lru_cache(maxsize=64)
def _circuit_open(retry_after_sec: int) -> GatewayResponse:
    # an open breaker refuses a flood of calls with a few dozen distinct answers: each is encoded once
    return GatewayResponse.error(unavailable("the upstream is failing and its circuit breaker is open",
                                             retry_after_sec, data={"reason": "circuit_open"}))


def upstream_error(exc: UpstreamError) -> GatewayResponse:
    if exc.kind == "circuit_open":
        return _circuit_open(math.ceil(exc.retry_after or 1)).copy()
    if exc.kind == "timeout":
        return GatewayResponse.error(ApiError(ErrorKind.UPSTREAM_TIMEOUT))
    if isinstance(exc, AnswerTooLarge):
        return GatewayResponse.error(ApiError(
            ErrorKind.UPSTREAM_UNREACHABLE, f"the upstream's answer passed this route's limit of {exc.limit} bytes "
            "(max_answer_bytes); it was cut off and nothing of it kept",
            data={"reason": "answer_too_large", "max_answer_bytes": exc.limit}))
    return GatewayResponse.error(ApiError(ErrorKind.UPSTREAM_UNREACHABLE, data={"reason": exc.kind}))


def refuse_headers(runtime: Runtime, scope: Scope) -> GatewayResponse | None:
    limit = runtime.config.max_header_bytes
    # the server's bound (exports_common.connection_limits) spares adding the headers up when it is within the limit
    bound = scope.get(HEADER_BYTES_BOUND)
    if (bound is not None and bound <= limit) or sum(len(k) + len(v) for k, v in scope["headers"]) <= limit:
        return None
    return GatewayResponse.error(ApiError(ErrorKind.HEADERS_TOO_LARGE, f"request headers must total at most "
                                                                       f"{limit} bytes"))


async def handle(runtime: Runtime, scope: Scope, receive: Receive) -> GatewayResponse:
    method, path = scope["method"], scope["path"]
    match = runtime.router.match(method, path)
    if isinstance(match, list):
        if match:
            return GatewayResponse.error(
                ApiError(ErrorKind.METHOD_NOT_ALLOWED, headers={"Allow": ", ".join(match)}))
        return GatewayResponse.error(ApiError(ErrorKind.NOT_FOUND, f"no route for {path}"))
    route = match.route
    try:
        upstream_path = match.upstream_path(path)
    except ApiError as exc:  # a dot segment
        return GatewayResponse.error(exc)
    values = first_values(scope)
    supplied = values.get(b"x-request-id", b"").decode("latin-1")
    request_id = supplied if supplied and _REQUEST_ID.match(supplied) else f"{random.getrandbits(128):032x}"
    ctx = RequestContext(scope=scope, receive=receive, header_values=values, method=method, route_name=route.name,
                         upstream=route.upstream, upstream_path=upstream_path, params=match.params,
                         request_id=request_id)
    services = runtime.services
    started = time.perf_counter()
    # the headers mapping only for a request that continues a trace: most do not
    parent = ctx.headers if b"traceparent" in values else None
    # the trace is also where the request's log lines find its ids
    with services.tracing.server(method, route.path, route.name, parent, scope.get("client"), ctx.request_id,
                                 match.params.get("task_id")) as request_trace:
        resp = await _run_chain(runtime, ctx, started)
        if request_trace.span is not INVALID_SPAN:  # an unsampled request's span records nothing: no call
            request_trace.span.set_attribute("http.response.status_code", resp.status)
    for name, value in ctx.response_headers.items():
        resp.set_header(name, value)
    resp.set_header("x-request-id", ctx.request_id)
    elapsed = time.perf_counter() - started
    services.metrics.requests.record(elapsed, route.name, method, route.path, resp.status)
    if runtime.config.access_log:
        if resp.events is None:
            access_log.write(ctx, resp, elapsed, request_trace.trace_id)
        else:  # a stream's line is written when it ends, with how long it lasted and what it sent
            resp.events.on_end = lambda events: access_log.write(
                ctx, resp, time.perf_counter() - started, request_trace.trace_id, events)
    return resp


async def _run_chain(runtime: Runtime, ctx: RequestContext, arrived: float) -> GatewayResponse:
    """The chain's answer, or an envelope for what went wrong; a chain that has not answered within its route's
    first-byte deadline of the request's arrival (a plugin that never returns) is cancelled and answered 504."""
    within = runtime.deadlines[ctx.route_name]
    deadline = asyncio.timeout(within - (time.perf_counter() - arrived))
    try:
        async with deadline:
            return await runtime.chains[ctx.route_name](ctx)
    except TimeoutError as exc:
        if not deadline.expired():  # a plugin's own wait that gave up: its failure, not the route's deadline
            return _failed(ctx, exc)
        log.warning("the request had no answer within its route's deadline; answered 504",
                    extra={"route": ctx.route_name, "deadline_sec": within})
        return GatewayResponse.error(ApiError(ErrorKind.UPSTREAM_TIMEOUT, f"no answer within this route's "
                                              f"{within:g} s", data={"reason": "deadline"}))
    except Exception as exc:  # noqa: BLE001  # each failure gets its envelope; _failed logs the unexpected ones
        return _failed(ctx, exc)


def _failed(ctx: RequestContext, exc: Exception) -> GatewayResponse:
    """The envelope for what stopped the chain."""
    if isinstance(exc, ApiError):
        return GatewayResponse.error(exc)
    if isinstance(exc, UpstreamError):
        if exc.kind != "circuit_open":  # an open breaker is logged when it opens, not for every refusal
            log.warning("upstream failed", extra={"route": ctx.route_name, "error": str(exc)})
        return upstream_error(exc)
    if isinstance(exc, RedisError):
        log.warning("shared state unavailable; answered 503", extra={"route": ctx.route_name, "error": str(exc)})
        return GatewayResponse.error(store_unavailable(exc))
    if _client_went_away(exc):
        log.info("the client went away before its request was read", extra={"route": ctx.route_name})
        return GatewayResponse(CLIENT_CLOSED)
    log.error("request failed inside the gateway", exc_info=exc, extra={"route": ctx.route_name})
    return GatewayResponse.error(ApiError(ErrorKind.INTERNAL))


def _client_went_away(exc: BaseException | None) -> bool:
    """Whether the client's disconnect is what stopped the request (perhaps wrapped by the upstream client)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ClientDisconnect):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
