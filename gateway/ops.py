"""The operations endpoints: health, readiness, metrics, OpenAPI, and the admin API.

They read the Runtime in force through the holder, never a copy, so after a
reload they describe the new config.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exports_common.envelope import ok
from exports_common.errors import ApiError, ErrorKind
from gateway import openapi, plugin_hooks, policy, telemetry
from gateway.address_limit import check_address
from gateway.admin_auth import AdminAuth
from gateway.admin_recovery import AdminRecovery
from gateway.response import GatewayResponse
from gateway.wiring import RuntimeHolder

OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


def mask_url(value: str) -> str:
    """A URL with the password in its user part replaced by *** (`redis://:***@host:6379/0`)."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or parts.password is None:
        return value
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def masked_urls(value: Any) -> Any:
    """`value` (a config as JSON) with every URL's password masked, wherever the URL is."""
    if isinstance(value, dict):
        return {k: masked_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked_urls(v) for v in value]
    return mask_url(value) if isinstance(value, str) and "@" in value else value


def is_ops_path(path: str) -> bool:
    return path in OPS_PATHS or path.startswith("/admin/")


class OpsEndpoints:
    def __init__(self, holder: RuntimeHolder) -> None:
        self.holder = holder
        self.export_types = openapi.ExportTypesSource()
        self.admin_auth = AdminAuth()

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/admin/routes", self.admin_routes, methods=["GET"]),
            Route("/admin/breakers", self.admin_breakers, methods=["GET"]),
            Route("/admin/stats", self.admin_stats, methods=["GET"]),
            Route("/admin/reload", self.admin_reload, methods=["POST"]),
            *AdminRecovery(lambda: self.holder.runtime.services, self.require_admin, self._recovery_upstream).routes(),
        ]

    async def require_admin(self, request: Request) -> None:
        runtime = self.holder.runtime
        await self.admin_auth.check(request, runtime.config.admin_token, runtime.services)

    async def healthz(self, request: Request) -> Response:
        return ok({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        runtime = self.holder.runtime
        problems = []
        loop = asyncio.get_running_loop()
        for name, upstream in runtime.services.upstreams.items():
            for endpoint in upstream.pool.endpoints:
                host = urlsplit(endpoint.url).hostname or ""
                try:
                    await asyncio.wait_for(loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), 2.0)
                except (TimeoutError, OSError):
                    problems.append(f"upstream {name}: cannot resolve {host}")
        redis = runtime.services.state.redis
        if redis is not None:
            try:
                await asyncio.wait_for(redis.ping(), 2.0)
            except (TimeoutError, RedisError) as exc:
                problems.append(f"redis: {type(exc).__name__}")
        if problems:
            raise ApiError(ErrorKind.UNAVAILABLE, "not ready: " + "; ".join(problems), data={"problems": problems},
                           headers={"Retry-After": "5"})
        return ok({"status": "ready", "routes": len(runtime.config.routes)})

    async def openapi(self, request: Request) -> Response | GatewayResponse:
        runtime = self.holder.runtime
        refused = await check_address(runtime.services, request.scope)
        if refused is not None:
            return refused
        types = await self.export_types.get(runtime)
        return Response(json.dumps(openapi.build(runtime.config, types)), media_type="application/json")

    async def metrics(self, request: Request) -> Response:
        runtime = self.holder.runtime
        if runtime.config.metrics_auth == "admin_token":
            await self.require_admin(request)
        services = runtime.services
        await plugin_hooks.before_scrape(services)  # a store that does not answer leaves the last value read
        body, content_type = telemetry.prometheus_text(services.metrics)
        return Response(body, media_type=content_type)

    async def admin_routes(self, request: Request) -> Response:
        await self.require_admin(request)
        in_force = self.holder.runtime.config
        config = in_force.model_dump(mode="json", exclude_none=True)
        config["admin_token"] = "***"
        config["download_signing"] = {"secrets": ["***"] * len(config["download_signing"]["secrets"])}
        for upstream in config["upstreams"].values():
            if upstream.get("service_token"):
                upstream["service_token"] = "***"
        config = masked_urls(config)  # redis_url, upstream URLs, an exporter's endpoint: without their passwords
        for route, shown in zip(in_force.routes, config["routes"], strict=True):
            # the plugins as a request meets them, every setting resolved, then the upstream call: its policy
            # and the breaker it goes through (the upstream's, or the route's own)
            shown["plugins"] = [{e.name: e.settings.model_dump(mode="json")} for e in route.plugins]
            shown["policy"] = route.policy.model_dump(mode="json", exclude={"circuit_breaker"}, exclude_none=True)
            breaker = in_force.breaker_of(route)
            if breaker is not None:
                shown["policy"]["circuit_breaker"] = {"name": breaker.name, **breaker.settings.model_dump(mode="json")}
        return ok(config)

    async def admin_breakers(self, request: Request) -> Response:
        await self.require_admin(request)
        breakers = self.holder.runtime.services.breakers.by_upstream
        return ok({name: breaker.describe() for name, breaker in breakers.items()})

    async def admin_stats(self, request: Request) -> Response:
        await self.require_admin(request)
        services = self.holder.runtime.services
        stats: dict[str, Any] = {"pid": os.getpid(), **policy.stats(services)}
        stats.update(await plugin_hooks.stats(services))  # each plugin reports its own part
        return ok(stats)

    async def admin_reload(self, request: Request) -> Response:
        await self.require_admin(request)
        allow = request.query_params.get("allow_removals", "false").lower()
        if allow not in ("true", "false"):
            raise ApiError(ErrorKind.VALIDATION, "allow_removals: must be true or false",
                           data={"field": "allow_removals", "reason": "must be true or false"})
        outcome = await self.holder.reload("admin", allow_removals=allow == "true")
        if outcome.problems:
            raise ApiError(ErrorKind.VALIDATION, "the new config was refused; the old one keeps serving",
                           data={"problems": outcome.problems, "removals": outcome.removals})
        return ok({"reloaded": True, "routes": len(self.holder.runtime.config.routes),
                   "restart_required": outcome.restart_required})

    def _recovery_upstream(self) -> str:
        """The export backend: the upstream named `exports`, else the first."""
        upstreams = self.holder.runtime.config.upstreams
        return "exports" if "exports" in upstreams else next(iter(upstreams))
