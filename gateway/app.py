"""The gateway ASGI app: operations endpoints, then every other path through its route's plugin chain."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import random
import re
import signal
import socket
import time
from pathlib import Path
from typing import AsyncIterator
from urllib.parse import urlsplit

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from exports_common import dev_mode, otel
from exports_common.config_loader import ConfigError, load_model
from exports_common.envelope import exception_handlers, ok
from exports_common.errors import ApiError, ErrorKind, unavailable
from exports_common.jsonlog import request_id_var, task_id_var, trace_id_var
from exports_common.redis_client import store_unavailable
from exports_common.signing import DownloadSigner
from gateway import access_log, openapi, telemetry, worker_metrics
from gateway.admin_recovery import AdminRecovery
from gateway.breakers import STATES, Breakers
from gateway.config import GatewayConfig, RouteConfig, plugin_of
from gateway.context import RequestContext
from gateway.limiter import Limiter
from gateway.outbox_drainer import OutboxDrainer
from gateway.plugins.rate_limit import check_address
from gateway.response import GatewayResponse
from gateway.runtime import Runtime, build_runtime, upstreams_of
from gateway.services import Services, open_redis, open_state
from gateway.tenants import TenantDirectory
from gateway.upstream import AiohttpUpstream, UpstreamError

log = logging.getLogger("gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# nginx's status for a request whose client closed the connection first: counted, never sent
CLIENT_CLOSED = 499
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


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
    return GatewayResponse.error(ApiError(ErrorKind.UPSTREAM_UNREACHABLE, data={"reason": exc.kind}))


class Gateway:
    def __init__(self, config: GatewayConfig, config_path: str | None) -> None:
        self.initial_config = config
        self.config_path = config_path
        self._runtime: Runtime | None = None
        self.config_hash = ""
        self._config_mtime = self._mtime()
        self.export_types = openapi.ExportTypesSource()
        self.ops_app = Starlette(routes=self.ops_routes(), lifespan=self.lifespan,
                                 exception_handlers=exception_handlers())
        # a slash redirect would be built from the client's Host header: a 404 envelope instead
        self.ops_app.router.redirect_slashes = False

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("the gateway has not started")
        return self._runtime

    def _mtime(self) -> float | None:
        try:
            return Path(self.config_path).stat().st_mtime if self.config_path else None
        except OSError:
            return None

    # -- lifecycle -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        config = self.initial_config
        metrics, tracing = telemetry.setup("gateway", config.tracing)
        redis = open_redis(config.redis_url)
        pool = max(u.pool_size for u in config.upstreams.values())
        services = Services(
            client=AiohttpUpstream(pool), metrics=metrics, tracing=tracing, tenants=TenantDirectory({}),
            signer=DownloadSigner(config.download_signing.secrets, config.download_signing.max_link_ttl_sec),
            upstreams=upstreams_of(config, metrics),
            state=open_state(redis, config.redis_prefix, config.state_dir), breakers=Breakers(metrics),
            limiter=Limiter(redis, config.redis_prefix),
        )
        self._observe(services)
        self._apply(build_runtime(config, services))
        watcher = asyncio.create_task(self._watch_config())
        drainer = asyncio.create_task(OutboxDrainer(lambda: self.runtime.services).run())
        where = worker_metrics.directory()
        publisher = None if where is None else asyncio.create_task(
            worker_metrics.publish_forever(metrics.registry, where))
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        try:
            yield
        finally:
            watcher.cancel()
            drainer.cancel()
            if publisher is not None:
                publisher.cancel()
            await services.client.close()
            otel.shutdown()
            if redis is not None:
                await redis.aclose()

    async def _watch_config(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            mtime = self._mtime()
            if mtime is not None and mtime != self._config_mtime:
                await self.reload()

    async def reload(self) -> list[str]:
        """Load the config file again; a config that does not validate is refused and the old one kept."""
        self._config_mtime = self._mtime()
        if not self.config_path:
            return ["the gateway was started without a config file"]
        try:
            config = load_model(self.config_path, GatewayConfig)
        except ConfigError as exc:
            log.error("config reload refused; the config in force keeps serving", extra={"problems": exc.problems})
            self.runtime.services.metrics.config_reloads.add("refused")
            return exc.problems
        unsafe = [] if dev_mode.dev_mode() else config.unsafe_defaults()
        if unsafe:
            self.runtime.services.metrics.config_reloads.add("refused")
            log.error("config reload refused outside dev mode; the config in force keeps serving",
                      extra={"problems": unsafe})
            return unsafe
        self._apply(build_runtime(config, self.runtime.services))
        self.runtime.services.metrics.config_reloads.add("applied")
        log.info("config reloaded", extra={"routes": len(config.routes), "config_hash": self.config_hash})
        return []

    def _apply(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.config_hash = hashlib.sha256(runtime.config.model_dump_json().encode()).hexdigest()[:16]
        runtime.services.metrics.seed([(r.name, r.upstream, _retry_reasons(r)) for r in runtime.config.routes])

    def _observe(self, services: Services) -> None:
        """The gauges read at scrape time (the outbox's size is refreshed by the /metrics handler)."""
        metrics = services.metrics
        metrics.observe_gauge("gateway_breaker_state", "0 closed, 1 half-open, 2 open", lambda: [
            (STATES.get(b.state, 2), {"upstream": name}) for name, b in services.breakers.by_upstream.items()])
        metrics.observe_gauge("gateway_retries_in_flight", "retries in flight, by upstream (the budget caps them)",
                              lambda: [(b.retries_in_flight, {"upstream": name})
                                       for name, b in services.retry_budgets.by_upstream.items()])
        metrics.observe_gauge("gateway_outbox_depth", "submissions waiting in the outbox for their upstream",
                              lambda: [(metrics.async_values.get("outbox_depth", 0.0), {})])
        metrics.observe_gauge("gateway_config_info", "the config in force: its hash (1 while it serves)",
                              lambda: [(1.0, {"hash": self.config_hash})])

    # -- the public path -------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Public paths go straight to their chain; operations endpoints and lifespan to Starlette.

        Dispatching here rather than through a Starlette catch-all route keeps the
        per-request cost of the hot path to what the chain itself needs.
        """
        if scope["type"] != "http":
            await self.ops_app(scope, receive, send)
        elif refused := self._refuse_headers(scope):
            await refused(scope, receive, send)
        elif _is_ops_path(scope["path"]):
            await self.ops_app(scope, receive, send)
        else:
            await (await self.handle(Request(scope, receive)))(scope, receive, send)

    def _refuse_headers(self, scope: Scope) -> GatewayResponse | None:
        limit = self.runtime.config.max_header_bytes
        if sum(len(k) + len(v) for k, v in scope["headers"]) <= limit:
            return None
        return GatewayResponse.error(ApiError(ErrorKind.HEADERS_TOO_LARGE, f"request headers must total at most "
                                                                           f"{limit} bytes"))

    async def handle(self, request: Request) -> GatewayResponse:
        runtime = self.runtime
        method, path = request.method, request.scope["path"]
        match = runtime.router.match(method, path)
        if isinstance(match, list):
            if match:
                return GatewayResponse.error(
                    ApiError(ErrorKind.METHOD_NOT_ALLOWED, headers={"Allow": ", ".join(match)}))
            return GatewayResponse.error(ApiError(ErrorKind.NOT_FOUND, f"no route for {path}"))
        route = match.route
        supplied = request.headers.get("x-request-id", "")
        ctx = RequestContext(
            request=request, method=method, route_name=route.name, upstream=route.upstream,
            upstream_path=match.upstream_path(path), params=match.params,
            request_id=supplied if _REQUEST_ID.match(supplied) else f"{random.getrandbits(128):032x}",
        )
        services = runtime.services
        started = time.perf_counter()
        request_id_var.set(ctx.request_id)
        with services.tracing.server(f"{method} {route.path}", request.headers,
                                     {"http.route": route.path, "gateway.route": route.name},
                                     request.scope.get("client")) as request_trace:
            trace_id_var.set(request_trace.trace_id)
            resp = await self._run_chain(runtime, ctx)
            request_trace.span.set_attribute("http.response.status_code", resp.status)
        for name, value in ctx.response_headers.items():
            resp.set_header(name, value)
        resp.set_header("x-request-id", ctx.request_id)
        elapsed = time.perf_counter() - started
        services.metrics.requests.record(elapsed, route.name, method, route.path, str(resp.status))
        if runtime.config.access_log:
            access_log.write(ctx, resp, elapsed, request_trace.trace_id)
        return resp

    async def _run_chain(self, runtime: Runtime, ctx: RequestContext) -> GatewayResponse:
        token = task_id_var.set(ctx.params.get("task_id"))
        try:
            return await runtime.chains[ctx.route_name](ctx)
        except ApiError as exc:
            return GatewayResponse.error(exc)
        except UpstreamError as exc:
            if exc.kind != "circuit_open":  # an open breaker is logged when it opens, not for every refusal
                log.warning("upstream failed", extra={"route": ctx.route_name, "error": str(exc)})
            return upstream_error(exc)
        except RedisError as exc:
            log.warning("shared state unavailable; answered 503", extra={"route": ctx.route_name, "error": str(exc)})
            return GatewayResponse.error(store_unavailable(exc))
        except Exception as exc:
            if _client_went_away(exc):
                log.info("the client went away before its request was read", extra={"route": ctx.route_name})
                return GatewayResponse(CLIENT_CLOSED)
            log.exception("request failed inside the gateway", extra={"route": ctx.route_name})
            return GatewayResponse.error(ApiError(ErrorKind.INTERNAL))
        finally:
            task_id_var.reset(token)

    # -- operations endpoints --------------------------------------------------------------------

    def _require_admin(self, request: Request) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        expected = self.runtime.config.admin_token
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
            raise ApiError(ErrorKind.UNAUTHORIZED, "send the admin token as 'Authorization: Bearer <token>'",
                           headers={"WWW-Authenticate": 'Bearer realm="admin"'})

    async def healthz(self, request: Request) -> Response:
        return ok({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        problems = []
        loop = asyncio.get_running_loop()
        for name, upstream in self.runtime.services.upstreams.items():
            for endpoint in upstream.pool.endpoints:
                host = urlsplit(endpoint.url).hostname or ""
                try:
                    await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), 2.0)
                except (TimeoutError, OSError):
                    problems.append(f"upstream {name}: cannot resolve {host}")
        redis = self.runtime.services.state.redis
        if redis is not None:
            try:
                await asyncio.wait_for(redis.ping(), 2.0)
            except (TimeoutError, RedisError) as exc:
                problems.append(f"redis: {type(exc).__name__}")
        if problems:
            raise ApiError(ErrorKind.UNAVAILABLE, "not ready: " + "; ".join(problems), data={"problems": problems},
                           headers={"Retry-After": "5"})
        return ok({"status": "ready", "routes": len(self.runtime.config.routes)})

    async def openapi(self, request: Request) -> Response:
        await check_address(self.runtime.services, request.scope)
        types = await self.export_types.get(self.runtime)
        return Response(json.dumps(openapi.build(self.runtime.config, types)), media_type="application/json")

    async def metrics(self, request: Request) -> Response:
        if self.runtime.config.metrics_auth == "admin_token":
            self._require_admin(request)
        services = self.runtime.services
        with contextlib.suppress(Exception):  # a store that does not answer leaves the last depth read
            services.metrics.async_values["outbox_depth"] = float(await services.outbox.size())
        body, content_type = telemetry.prometheus_text(services.metrics)
        return Response(body, media_type=content_type)

    async def admin_routes(self, request: Request) -> Response:
        self._require_admin(request)
        config = self.runtime.config.model_dump(mode="json", exclude_none=True)
        config["admin_token"] = "***"
        config["download_signing"] = {"secrets": ["***"] * len(config["download_signing"]["secrets"])}
        return ok(config)

    async def admin_breakers(self, request: Request) -> Response:
        self._require_admin(request)
        breakers = self.runtime.services.breakers.by_upstream
        return ok({name: breaker.describe() for name, breaker in breakers.items()})

    async def admin_stats(self, request: Request) -> Response:
        self._require_admin(request)
        services = self.runtime.services
        metrics = services.metrics
        return ok({
            "pid": os.getpid(),
            "status_cache": {"entries": services.status_cache.size(), "hits": metrics.cache.total(result="hit"),
                             "misses": metrics.cache.total(result="miss"),
                             "coalesced": metrics.cache.total(result="coalesced")},
            "idempotency_keys": services.idempotency_store.size(),
            "outbox": {"pending": await services.outbox.size(), "delivered": metrics.outbox.total(outcome="delivered"),
                       "refused": metrics.outbox.total(outcome="refused")},
            "retry_budget": {name: b.describe() for name, b in services.retry_budgets.by_upstream.items()},
        })

    async def admin_reload(self, request: Request) -> Response:
        self._require_admin(request)
        problems = await self.reload()
        if problems:
            raise ApiError(ErrorKind.VALIDATION, "the new config was refused; the old one keeps serving",
                           data={"problems": problems})
        return ok({"reloaded": True, "routes": len(self.runtime.config.routes)})

    def ops_routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/admin/routes", self.admin_routes, methods=["GET"]),
            Route("/admin/breakers", self.admin_breakers, methods=["GET"]),
            Route("/admin/stats", self.admin_stats, methods=["GET"]),
            Route("/admin/reload", self.admin_reload, methods=["POST"]),
            *AdminRecovery(lambda: self.runtime.services, self._require_admin, self._recovery_upstream).routes(),
        ]

    def _recovery_upstream(self) -> str:
        """The export backend: the upstream named `exports`, else the first."""
        upstreams = self.runtime.config.upstreams
        return "exports" if "exports" in upstreams else next(iter(upstreams))


def _client_went_away(exc: BaseException | None) -> bool:
    """Whether the client's disconnect is what stopped the request (perhaps wrapped by the upstream client)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ClientDisconnect):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _retry_reasons(route: RouteConfig) -> list[str]:
    return [str(reason) for entry in route.plugins for name, settings in [plugin_of(entry)] if name == "retry"
            for reason in getattr(settings, "retry_on", [])]


def _is_ops_path(path: str) -> bool:
    return path in OPS_PATHS or path.startswith("/admin/")


def create_app(config: GatewayConfig, config_path: str | None = None) -> Gateway:
    return Gateway(config, config_path)
