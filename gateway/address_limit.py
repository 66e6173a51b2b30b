"""A limit's refusal (429 with the RateLimit headers), and the per-address limit for callers no tenant answers for.

The per-address limit guards every public path a caller may reach without an API
key: routes (through the rate_limit plugin) and /openapi.json alike.
"""
from __future__ import annotations

import math

from starlette.types import Scope

from exports_common.errors import ApiError, ErrorKind
from gateway.client_address import client_address
from gateway.limiter import Decision, Quota
from gateway.services import Services


def ratelimit_headers(policy: str, quota: Quota, decision: Decision) -> dict[str, str]:
    wait = decision.reset if decision.allowed else decision.retry_after
    return {
        "RateLimit-Policy": f'"{policy}";q={quota.burst};w={max(1, math.ceil(quota.window_sec))}',
        "RateLimit": f'"{policy}";r={decision.remaining};t={math.ceil(wait)}',
    }


def refusal(policy: str, quota: Quota, decision: Decision, who: str) -> ApiError:
    seconds = max(1, math.ceil(decision.retry_after))
    return ApiError(
        ErrorKind.RATE_LIMITED,
        f"{who} is over its {policy} limit ({quota.per_sec:g}/s, bursts of {quota.burst}); retry after {seconds} s",
        data={"limit": policy, "per_sec": quota.per_sec, "burst": quota.burst, "retry_after_sec": seconds},
        headers={"Retry-After": str(seconds), **ratelimit_headers(policy, quota, decision)},
    )


async def check_address(services: Services, scope: Scope) -> None:
    """The per-address limit for a request no tenant answers for; raises 429 over it."""
    limits = services.tenants.limits
    address = client_address(scope)
    decision = await services.limiter.hit(f"addr:{address}", "address", limits.per_address,
                                          limits.gateway_processes)
    if not decision.allowed:
        raise refusal("address", limits.per_address, decision, f"client address {address}")
