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

import functools
import math
from typing import ClassVar, Literal

from pydantic import Field
from starlette.types import Scope

from exports_common.errors import ApiError, ErrorKind
from gateway.client_address import client_address
from gateway.context import Handler, RequestContext
from gateway.limiter import Decision, Quota
from gateway.plugins.base import Settings
from gateway.response import GatewayResponse
from gateway.services import Services

ACTIVE_TASKS_HEADER = "x-tenant-max-active-tasks"


class RateLimitSettings(Settings):
    limit: Literal["requests", "submits"] = Field(description="which of the tenant's rates this route draws on")
    active_tasks: bool = Field(False, description="send the tenant's max_active_tasks to the upstream")


@functools.lru_cache(maxsize=256)
def _policy_header(policy: str, quota: Quota) -> str:
    return f'"{policy}";q={quota.burst};w={max(1, math.ceil(quota.window_sec))}'


def ratelimit_headers(policy: str, quota: Quota, decision: Decision) -> dict[str, str]:
    wait = decision.reset if decision.allowed else decision.retry_after
    return {"RateLimit-Policy": _policy_header(policy, quota),
            "RateLimit": f'"{policy}";r={decision.remaining};t={math.ceil(wait)}'}


@functools.lru_cache(maxsize=1024)
def _refusal(policy: str, quota: Quota, who: str, seconds: int) -> GatewayResponse:
    # a flood is refused with a handful of distinct answers (one per whole second to wait): each is encoded once
    return GatewayResponse.error(ApiError(
        ErrorKind.RATE_LIMITED,
        f"{who} is over its {policy} limit ({quota.per_sec:g}/s, bursts of {quota.burst}); retry after {seconds} s",
        data={"limit": policy, "per_sec": quota.per_sec, "burst": quota.burst, "retry_after_sec": seconds},
        headers={"Retry-After": str(seconds), "RateLimit-Policy": _policy_header(policy, quota),
                 "RateLimit": f'"{policy}";r=0;t={seconds}'},
    ))


def refusal(policy: str, quota: Quota, decision: Decision, who: str) -> GatewayResponse:
    """The 429 for a refused request (a copy: the gateway adds its own headers to every answer)."""
    return _refusal(policy, quota, who, max(1, math.ceil(decision.retry_after))).copy()


async def check_address(services: Services, scope: Scope) -> GatewayResponse | None:
    """The per-address limit for a request no tenant answers for: its 429 over the limit, else None."""
    limits = services.tenants.limits
    address = client_address(scope)
    decision = await services.limiter.hit(f"addr:{address}", "address", limits.per_address,
                                          limits.gateway_processes)
    if decision.allowed:
        return None
    await services.refusal_hold(f"addr:{address}", limits.hold)
    return refusal("address", limits.per_address, decision, f"client address {address}")


class RateLimit:
    name: ClassVar[str] = "rate_limit"
    Settings: ClassVar[type[RateLimitSettings]] = RateLimitSettings

    def __init__(self, next: Handler, settings: RateLimitSettings, services: Services, route: str) -> None:
        self.next = next
        self.limit = settings.limit
        self.active_tasks = settings.active_tasks
        self.services = services

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        tenants = self.services.tenants
        tenant = tenants.caller(ctx)
        if tenant is None:
            refused = await check_address(self.services, ctx.request.scope)
            return refused if refused is not None else await self.next(ctx)
        limits = tenants.limits_of(tenant)
        quota = limits.submits if self.limit == "submits" else limits.requests
        decision = await self.services.limiter.hit(tenant, self.limit, quota, tenants.limits.gateway_processes)
        if not decision.allowed:
            await self.services.refusal_hold(f"{tenant}:{self.limit}", tenants.limits.hold)
            return refusal(self.limit, quota, decision, f"tenant {tenant}")
        if self.active_tasks:
            ctx.upstream_headers[ACTIVE_TASKS_HEADER] = str(limits.max_active_tasks)
        resp = await self.next(ctx)
        if self.limit == "submits":
            for name, value in ratelimit_headers(self.limit, quota, decision).items():
                resp.set_header(name, value)
        return resp
