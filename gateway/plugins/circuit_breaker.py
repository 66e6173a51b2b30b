"""circuit_breaker: one breaker per upstream, and one per tenant; while open, calls fail at once.

`fail_max` consecutive failures open a breaker; after `reset_timeout_sec` one trial
request goes through (the others are refused at once) and its success closes it.
Connect errors, timeouts and resets count toward the upstream's shared breaker.
A listed status counts toward the calling tenant's own breaker, and toward the
shared one only while at least two tenants see such statuses within `window_sec`
(gateway/breakers.py): one tenant cannot open the breaker for everyone. It is
the innermost part of the route's upstream policy, whatever its place in the YAML;
every route to an upstream must configure its breaker alike (`per_upstream`). A 4xx
never counts, and neither does a client that goes away.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from gateway.breakers import STATES, Breaker, guarded
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services


class CircuitBreakerSettings(Settings):
    fail_max: int = Field(5, ge=1, description="consecutive failures that open the breaker")
    reset_timeout_sec: float = Field(10.0, gt=0, description="how long it stays open before one trial")
    failure_statuses: list[int] = Field(default_factory=lambda: [500, 502, 503, 504])
    window_sec: float = Field(10.0, gt=0, description="failure statuses of two tenants within this reach the "
                                                      "shared breaker")

    @field_validator("failure_statuses")
    @classmethod
    def _server_errors_only(cls, value: list[int]) -> list[int]:
        if any(not 500 <= s <= 599 for s in value):
            raise ValueError("only 5xx statuses may count as failures; a 4xx is the client's doing")
        return value


class CircuitBreaker(PluginBase[CircuitBreakerSettings]):
    name: ClassVar[str] = "circuit_breaker"
    Settings: ClassVar[type[CircuitBreakerSettings]] = CircuitBreakerSettings
    upstream_policy: ClassVar[int] = 3  # innermost: each try is one call the breaker judges
    per_upstream: ClassVar[bool] = True  # one breaker per upstream, whichever route calls it

    def __init__(self, next: Handler, settings: CircuitBreakerSettings, services: Services,
                 route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.failures = frozenset(settings.failure_statuses)
        self.breakers = services.breakers
        self.breaker: Breaker | None = None

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        breaker = self.breaker
        if breaker is None:  # a route has one upstream; after a reload, its first call applies the new settings
            breaker = self.breaker = self.breakers.get(ctx.upstream, self.settings.fail_max,
                                                       self.settings.reset_timeout_sec, self.settings.window_sec)
        return await guarded(breaker, lambda: self.next(ctx), self.failures, ctx.tenant)

    @classmethod
    def observe(cls, services: Services) -> None:
        services.metrics.observe_gauge("gateway_breaker_state", "0 closed, 1 half-open, 2 open", lambda: [
            (STATES.get(b.state, 2), {"upstream": name}) for name, b in services.breakers.by_upstream.items()])
