"""A limit's refusal (429 with the RateLimit headers), and the per-address limit for callers no tenant answers for.

The per-address limit guards every public path a caller may reach without an API
key: routes (through the rate_limit plugin) and /openapi.json alike.
"""
from __future__ import annotations

import functools
import math

from starlette.types import Scope

from exports_common.errors import ApiError, ErrorKind
from gateway.client_address import client_address
from gateway.limiter import Decision, Quota
from gateway.response import GatewayResponse
from gateway.services import Services


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
    address = client_address(scope, services.trusted_proxies)
    decision = await services.limiter.hit(f"addr:{address}", "address", limits.per_address,
                                          limits.gateway_processes)
    if decision.allowed:
        return None
    await services.refusal_hold(f"addr:{address}", limits.hold)
    return refusal("address", limits.per_address, decision, f"client address {address}")
