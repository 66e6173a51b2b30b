"""The admin token check, with failed attempts limited per client address (token guessing).

A caller may fail 20 times at once and 5 times a second after that (a token bucket per
address, shared through Redis when configured); past that, every admin request from
the address is answered 429 with `Retry-After`, the right token or not, until the
bucket has room again, so guessing cannot go faster whatever is sent. Each failure is
counted in `gateway_admin_auth_failures_total{outcome}`: `refused` (401) or `limited`
(429). The address is the client's as gateway/client_address.py decides it.
"""
from __future__ import annotations

import hmac
import math
import time

from starlette.requests import Request

from exports_common.errors import ApiError, ErrorKind
from gateway.client_address import client_address
from gateway.limiter import Quota
from gateway.services import Services

FAILURES = Quota(per_sec=5, burst=20)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="admin"'}


class AdminAuth:
    def __init__(self) -> None:
        # address -> when it may try again (monotonic): refused without comparing a token until then
        self._locked: dict[str, float] = {}
        self._sweep_at = 10_000

    async def check(self, request: Request, token: str, services: Services) -> None:
        """Raise 401 (a wrong or missing token) or 429 (too many failures from this address); None: admitted."""
        address = client_address(request.scope, services.trusted_proxies)
        now = time.monotonic()
        until = self._locked.get(address)
        if until is not None:
            if until > now:
                raise self._limited(services, until - now)
            del self._locked[address]
        scheme, _, sent = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode()):
            return
        limits = services.tenants.limits
        decision = await services.limiter.hit(f"admin:{address}", "admin_auth", FAILURES, limits.gateway_processes)
        if not decision.allowed:
            self._lock(address, now + decision.retry_after)
            raise self._limited(services, decision.retry_after)
        services.metrics.admin_auth_failures.add("refused")
        raise ApiError(ErrorKind.UNAUTHORIZED, "send the admin token as 'Authorization: Bearer <token>'",
                       headers=_CHALLENGE)

    def _lock(self, address: str, until: float) -> None:
        if len(self._locked) > self._sweep_at:
            now = time.monotonic()
            self._locked = {a: t for a, t in self._locked.items() if t > now}
            self._sweep_at = max(10_000, 2 * len(self._locked))
        self._locked[address] = until

    @staticmethod
    def _limited(services: Services, wait: float) -> ApiError:
        services.metrics.admin_auth_failures.add("limited")
        seconds = str(max(1, math.ceil(wait)))
        return ApiError(ErrorKind.RATE_LIMITED, f"too many failed admin authentications from this address; retry "
                        f"after {seconds} s", data={"limit": "admin_auth", "per_sec": FAILURES.per_sec,
                                                    "burst": FAILURES.burst, "retry_after_sec": int(seconds)},
                        headers={"Retry-After": seconds})
