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

from typing import Awaitable, ClassVar, Literal

from pydantic import Field

from gateway.address_limit import check_address, ratelimit_headers, refusal
from gateway.context import Handler, RequestContext
from gateway.limiter import Decision, Quota
from gateway.plugins.base import Gatekeeper, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

ACTIVE_TASKS_HEADER = "x-tenant-max-active-tasks"


class RateLimitSettings(Settings):
    limit: Literal["requests", "submits"] = Field(description="which of the tenant's rates this route draws on")
    active_tasks: bool = Field(False, description="send the tenant's max_active_tasks to the upstream")


class RateLimit(Gatekeeper[RateLimitSettings]):
    name: ClassVar[str] = "rate_limit"
    Settings: ClassVar[type[RateLimitSettings]] = RateLimitSettings

    def __init__(self, next: Handler, settings: RateLimitSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.limit = settings.limit
        self.submits = settings.limit == "submits"
        self.active_tasks = settings.active_tasks

    def admit(self, ctx: RequestContext) -> Awaitable[GatewayResponse] | None:
        tenants = self.services.tenants
        tenant = tenants.caller(ctx)
        if tenant is None:
            return self._by_address(ctx)
        limits = tenants.limits_of(tenant)
        if self.active_tasks:  # sent upstream only if the request is admitted
            ctx.upstream_headers[ACTIVE_TASKS_HEADER] = str(limits.max_active_tasks)
        if self.submits:  # the answer carries the RateLimit headers, from the decision's numbers
            return self._decided(ctx, tenant, limits.submits)
        decision = self.services.limiter.hit_in_process(tenant, self.limit, limits.requests)
        if decision is not None and decision.allowed:
            return None
        # refused (the decision holds the numbers a refusal needs), or the limits are in Redis
        return self._decided(ctx, tenant, limits.requests, decision)

    async def _by_address(self, ctx: RequestContext) -> GatewayResponse:
        refused = await check_address(self.services, ctx.scope)
        return refused if refused is not None else await self.next(ctx)

    async def _decided(self, ctx: RequestContext, tenant: str, quota: Quota,
                       decision: Decision | None = None) -> GatewayResponse:
        """The request against `quota`, by `decision` when this process has already made it."""
        services = self.services
        limits = services.tenants.limits
        if decision is None:
            decision = services.limiter.hit_in_process(tenant, self.limit, quota)
        if decision is None:
            decision = await services.limiter.hit(tenant, self.limit, quota, limits.gateway_processes)
        if not decision.allowed:
            await services.refusal_hold(f"{tenant}:{self.limit}", limits.hold)
            return refusal(self.limit, quota, decision, f"tenant {tenant}")
        resp = await self.next(ctx)
        if self.submits:
            for name, value in ratelimit_headers(self.limit, quota, decision).items():
                resp.set_header(name, value)
        return resp
