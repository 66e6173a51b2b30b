"""stale_if_error: when the upstream cannot answer a status read, answer the last state seen.

Every 200 is remembered (per tenant and task, for `keep_sec`, bounded). On a
connect error, timeout, open breaker or 5xx the remembered answer is served with
`X-Degraded: stale` and `Age`; with nothing remembered, 503 with `Retry-After`
(the seconds until the breaker's trial when it is open).
"""
from __future__ import annotations

import time
from typing import ClassVar

from pydantic import Field

from exports_common.errors import unavailable
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse, freeze, thaw
from gateway.services import Services
from gateway.upstream import UpstreamError


class StaleIfErrorSettings(Settings):
    keep_sec: float = Field(3600.0, gt=0, description="how long the last answer seen is kept")
    param: str = "task_id"
    on_statuses: list[int] = Field(default_factory=lambda: [500, 502, 503, 504])
    retry_after_sec: int = Field(5, ge=1, description="Retry-After on a 503 when no breaker says better")


class StaleIfError(PluginBase[StaleIfErrorSettings]):
    name: ClassVar[str] = "stale_if_error"
    Settings: ClassVar[type[StaleIfErrorSettings]] = StaleIfErrorSettings
    needs: ClassVar[frozenset[str]] = frozenset({"tenant"})  # answers are kept per tenant

    def __init__(self, next: Handler, settings: StaleIfErrorSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.store = services.state.kv("seen")
        self.degraded = services.metrics.degraded
        for kind in ("stale", "unavailable"):
            self.degraded.seed(self.route, kind)
        self.on_statuses = frozenset(settings.on_statuses)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        key = ctx.tenant_key(self.settings.param)
        try:
            resp = await self.next(ctx)
        except UpstreamError as exc:
            return await self._fallback(key, exc.retry_after)
        if resp.status == 200:
            await self.store.set(key, freeze(resp, await resp.read()), self.settings.keep_sec)
        elif resp.status in self.on_statuses:
            resp.close()
            return await self._fallback(key, None)
        return resp

    async def _fallback(self, key: str, retry_after: float | None) -> GatewayResponse:
        raw = await self.store.get(key)
        if raw is None:
            self.degraded.add(self.route, "unavailable")
            raise unavailable("the upstream cannot answer and no earlier state is known",
                              retry_after or self.settings.retry_after_sec)
        self.degraded.add(self.route, "stale")
        resp, stored_at = thaw(raw)
        resp.set_header("x-degraded", "stale")
        resp.set_header("age", str(max(0, int(time.time() - stored_at))))
        return resp
