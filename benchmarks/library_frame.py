"""The gateway's routes and plugin chains served through the libraries' request frame, to measure the gateway's own.

The same config, services and plugins as the gateway (`gateway.wiring.running`), served
the way the libraries would have it: a Starlette app with one `Route` per config route
(its path and methods), whose endpoint takes Starlette's `Request`, builds the
`RequestContext` by keyword, runs the route's chain with every plugin as a handler of
its own (no `Gatekeepers` composite) inside `asyncio.timeout(first_byte_deadline)`,
under an OpenTelemetry SDK span (its standard sampler, id generator and W3C propagator,
extracted from the request and injected into each upstream call) and answers with a
Starlette `Response`. What the gateway does per request besides the frame is done the
same way: the header-size refusal, the `x-request-id` echo, the request metric, the
access log line, the log ids.

Not served: the event-stream routes (their answer is written by the gateway itself), and
reload (the chains are built once, at start).

Run: python -m benchmarks.library_frame run --config FILE (the gateway's config file)
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import re
import sys
import time
from typing import AsyncIterator, Awaitable, Callable

from opentelemetry import propagate
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracer, SpanKind, Tracer, format_trace_id
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from exports_common import cli, otel
from exports_common.envelope import exception_handlers
from exports_common.errors import ApiError, ErrorKind
from exports_common.jsonlog import request_ids_var
from exports_common.redis_client import store_unavailable
from gateway import access_log, dispatch
from gateway.config import GatewayConfig, RouteConfig
from gateway.context import Handler, RequestContext, first_values
from gateway.ops import OpsEndpoints
from gateway.plugin_registry import registry
from gateway.plugins.base import RouteInfo
from gateway.policy import upstream_call
from gateway.proxy import Proxy
from gateway.response import GatewayResponse
from gateway.router import Match
from gateway.runtime import RouteViews, Runtime
from gateway.tracing import Tracing
from gateway.upstream import UpstreamError
from gateway.wiring import RuntimeHolder, running

log = logging.getLogger("gateway")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # the gateway's rule for a client's x-request-id
STREAMING_PLUGINS = {"events"}  # a route ending in one answers with an event stream: not served here


def propagating(proxy: Handler) -> Handler:
    """The proxy with the SDK's propagator writing the current span's `traceparent` into each try's headers."""

    def call(ctx: RequestContext) -> Awaitable[GatewayResponse]:
        propagate.inject(ctx.upstream_headers)
        return proxy(ctx)

    return call


def library_chain(route: RouteConfig, runtime: Runtime, views: RouteViews) -> Handler:
    """The route's chain as `gateway.runtime.build_chain` builds it, but every plugin a handler of its own."""
    services = runtime.services
    breaker = runtime.config.breaker_of(route)
    methods = tuple(route.methods)
    proxy = propagating(Proxy(services.upstreams[route.upstream], services, route.max_body_bytes,
                              breaker.name if breaker is not None else None, route.max_answer_bytes))
    call = upstream_call(proxy, route.policy, breaker, services, RouteInfo(route.name, route.upstream, methods, proxy))
    info = RouteInfo(route.name, route.upstream, methods, call, views.get)
    handler: Handler = call
    for entry in reversed(route.plugins):
        handler = registry().get(entry.name)(handler, entry.settings, services, info)
    return handler


def library_tracer(tracing: Tracing) -> Tracer:
    """The SDK's tracer with the sampler `exports_common.otel.install` gives a process that does not decide for
    itself (ALWAYS_OFF when nothing is exported, else the config's, e.g. ParentBased(TraceIdRatioBased)),
    ending its spans into the gateway's span processor."""
    config = tracing.config
    sampler = ALWAYS_OFF if config.exporter == "none" else otel.sampler(config)
    provider = TracerProvider(resource=Resource.create({"service.name": config.service_name or "gateway"}),
                              sampler=sampler)
    if tracing.processor is not None:
        provider.add_span_processor(tracing.processor)
    return provider.get_tracer("gateway")


def failure(route: str, exc: Exception) -> GatewayResponse:
    """The envelope for what stopped a chain, as the gateway maps it (gateway/dispatch.py)."""
    if isinstance(exc, ApiError):
        return GatewayResponse.error(exc)
    if isinstance(exc, UpstreamError):
        if exc.kind != "circuit_open":
            log.warning("upstream failed", extra={"route": route, "error": str(exc)})
        return dispatch.upstream_error(exc)
    if isinstance(exc, RedisError):
        log.warning("shared state unavailable; answered 503", extra={"route": route, "error": str(exc)})
        return GatewayResponse.error(store_unavailable(exc))
    if isinstance(exc, ClientDisconnect) or isinstance(exc.__cause__, ClientDisconnect):
        return GatewayResponse(dispatch.CLIENT_CLOSED)
    log.exception("request failed inside the gateway", extra={"route": route})
    return GatewayResponse.error(ApiError(ErrorKind.INTERNAL))


def starlette_response(resp: GatewayResponse) -> Response:
    """Starlette's response for the gateway's answer: bytes as they are, a streamed body streamed."""
    headers = dict(resp.headers)
    if resp.body is not None or resp.stream is None:
        headers.pop("content-length", None)  # Starlette's, from the body
        return Response(resp.body or b"", resp.status, headers)
    return StreamingResponse(resp.stream, resp.status, headers, background=BackgroundTask(resp.close))


class LibraryFrame:
    """The Starlette app: a `Route` per config route, then the gateway's operations endpoints."""

    def __init__(self, config: GatewayConfig, config_path: str | None) -> None:
        self.holder = RuntimeHolder(config, config_path)
        self.chains: dict[str, Handler] = {}
        self.tracer: Tracer = NoOpTracer()  # the SDK's, once the services are open
        served = [route for route in config.routes if not {p.name for p in route.plugins} & STREAMING_PLUGINS]
        # the config's routes first: Starlette tries routes in order, and none of them shares a path with the
        # operations endpoints, so a public request is not matched against those first
        routes: list[BaseRoute] = [*(Route(r.path, self.endpoint(r), methods=r.methods, name=r.name) for r in served),
                                   *OpsEndpoints(self.holder).routes()]
        self.app = Starlette(routes=routes, lifespan=self.lifespan, exception_handlers=exception_handlers())
        self.app.router.redirect_slashes = False

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with running(self.holder):
            runtime = self.holder.runtime
            views = RouteViews(runtime.config, runtime.services)
            self.chains = {route.name: library_chain(route, runtime, views) for route in runtime.config.routes}
            self.tracer = library_tracer(runtime.services.tracing)
            gc.freeze()  # as the gateway does once its chains are built
            yield

    def endpoint(self, route: RouteConfig) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            runtime = self.holder.runtime
            scope = request.scope
            if refused := dispatch.refuse_headers(runtime, scope):
                return starlette_response(refused)
            params = {name: str(value) for name, value in request.path_params.items()}
            try:
                upstream_path = Match(route, params).upstream_path(scope["path"])
            except ApiError as exc:  # a dot segment
                return starlette_response(GatewayResponse.error(exc))
            supplied = request.headers.get("x-request-id", "")
            ctx = RequestContext(
                scope=scope, receive=request.receive, header_values=first_values(scope), method=request.method,
                route_name=route.name, upstream=route.upstream, upstream_path=upstream_path, params=params,
                request_id=supplied if supplied and REQUEST_ID.match(supplied) else f"{random.getrandbits(128):032x}")
            started = time.perf_counter()
            with self.tracer.start_as_current_span(
                    f"{ctx.method} {route.path}", propagate.extract(request.headers), SpanKind.SERVER,
                    {"http.route": route.path, "gateway.route": route.name}) as span:
                trace_id = format_trace_id(span.get_span_context().trace_id)
                request_ids_var.set({"request_id": ctx.request_id, "trace_id": trace_id,
                                     "task_id": params.get("task_id")})
                resp = await self.run_chain(route, ctx)
                span.set_attribute("http.response.status_code", resp.status)
            for name, value in ctx.response_headers.items():
                resp.set_header(name, value)
            resp.set_header("x-request-id", ctx.request_id)
            elapsed = time.perf_counter() - started
            runtime.services.metrics.requests.record(elapsed, route.name, ctx.method, route.path, resp.status)
            if runtime.config.access_log:
                access_log.write(ctx, resp, elapsed, trace_id)
            return starlette_response(resp)

        return answer

    async def run_chain(self, route: RouteConfig, ctx: RequestContext) -> GatewayResponse:
        """The chain's answer within the route's first-byte deadline (else a 504), or the envelope for its error."""
        deadline = asyncio.timeout(route.first_byte_deadline)
        try:
            async with deadline:
                return await self.chains[route.name](ctx)
        except Exception as exc:  # noqa: BLE001 - mapped to its envelope; an unexpected one logged with its traceback
            if isinstance(exc, TimeoutError) and deadline.expired():
                log.warning("the request had no answer within its route's deadline; answered 504",
                            extra={"route": route.name, "deadline_sec": route.first_byte_deadline})
                return GatewayResponse.error(ApiError(
                    ErrorKind.UPSTREAM_TIMEOUT, f"no answer within this route's {route.first_byte_deadline:g} s",
                    data={"reason": "deadline"}))
            return failure(route.name, exc)


def create_app(config: GatewayConfig, config_path: str | None = None) -> Starlette:
    return LibraryFrame(config, config_path).app


if __name__ == "__main__":
    sys.exit(cli.main("benchmarks.library_frame", GatewayConfig, "config/gateway.yaml", create_app))
