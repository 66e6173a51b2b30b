"""rate_limit: a tenant's request or submit rate (token buckets), or a client address's.

It runs before auth and finds the caller itself: a valid API key's tenant is held
to that tenant's limits; anything else (no key, as on signed downloads, or a wrong
key, which auth then answers 401) to the per-address limit, so guessing keys is
limited too. Over a limit: 429 with `Retry-After` and the `RateLimit-Policy` /
`RateLimit` headers (draft-ietf-httpapi-ratelimit-headers); `limit: submits`
sends the headers on every answer.

`active_tasks: true` sends the tenant's max_active_tasks upstream
(`X-Tenant-Max-Active-Tasks`); the backend counts the tenant's active tasks and
answers 429 (code 42901) at that quota, which passes through as it is.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gateway.address_limit import check_address, ratelimit_headers, refusal
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

ACTIVE_TASKS_HEADER = "x-tenant-max-active-tasks"


class RateLimitSettings(Settings):
    limit: Literal["requests", "submits"] = Field(description="which of the tenant's rates this route draws on")
    active_tasks: bool = Field(False, description="send the tenant's max_active_tasks to the upstream")


class RateLimit(PluginBase[RateLimitSettings]):
    name: ClassVar[str] = "rate_limit"
    Settings: ClassVar[type[RateLimitSettings]] = RateLimitSettings
    gatekeeper: ClassVar[bool] = True

    def __init__(self, next: Handler, settings: RateLimitSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.limit = settings.limit
        self.submits = settings.limit == "submits"
        self.active_tasks = settings.active_tasks

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        services = self.services
        tenants = services.tenants
        tenant = tenants.caller(ctx)
        if tenant is None:
            refused = await check_address(services, ctx.scope)
            return refused if refused is not None else await self.next(ctx)
        limits = tenants.limits.by_tenant[tenant]  # limits_of's lookup, without its call
        quota = limits.submits if self.submits else limits.requests
        decision = services.limiter.hit_in_process(tenant, self.limit, quota)
        if decision is None:
            decision = await services.limiter.hit(tenant, self.limit, quota, tenants.limits.gateway_processes)
        if not decision.allowed:
            await self.services.refusal_hold(f"{tenant}:{self.limit}", tenants.limits.hold)
            return refusal(self.limit, quota, decision, f"tenant {tenant}")
        if self.active_tasks:
            ctx.upstream_headers[ACTIVE_TASKS_HEADER] = str(limits.max_active_tasks)
        resp = await self.next(ctx)
        if self.submits:
            for name, value in ratelimit_headers(self.limit, quota, decision).items():
                resp.set_header(name, value)
        return resp
