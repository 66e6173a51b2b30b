"""circuit_breaker: upstream config, as Envoy's cluster circuit breakers; while open, calls fail at once.

`upstreams.<name>.circuit_breaker` gives an upstream one breaker that every route
to it shares, with one breaker per tenant beside it (gateway/breakers.py). A route
may refine it with `policy.circuit_breaker`: `scope: route` gives the route a
breaker state of its own on the same upstream (the upstream's settings, any given
here replacing them), so that anonymous downloads, say, neither open nor are
refused by the breaker of the API routes; `scope: none` keeps the route out of
its upstream's breaker.

`fail_max` consecutive failures open a breaker; after `reset_timeout_sec` one trial
request goes through (the others are refused at once) and its success closes it.
Connect errors, timeouts and resets count toward the shared breaker. A listed
status counts toward the calling tenant's own breaker, and toward the shared one
only while at least two tenants see such statuses within `window_sec`: one tenant
cannot open the breaker for everyone. An unavailable status (502, 503, 504) is the
tenant's own only while another tenant is being served (gateway/breakers.py). A 4xx
never counts, and neither does a client that goes away. The breaker is the innermost part of the route's upstream
call: each try is one call it judges.

Whose a failure status is depends on the route, decided when it is built (`StatusOwner`):
the calling tenant's where a plugin of the route provides `tenant` (a caller it names
none for, a signed download's, counts as one anonymous tenant, `-`). On a route with no
tenant provider the breaker never reads `tenant`: sharing its upstream's breaker, its
callers are that one anonymous tenant, so their 5xx alone never open the tenants'
breaker (any caller of a route without `auth` could, else); on a breaker of its own
(`scope: route`) there is no tenant to isolate and none to protect, so a 5xx counts
toward it directly, as a transport failure does, and an open one refuses as the
upstream's breaker does (503 `circuit_open`, the route's degradation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Literal

from pydantic import Field, field_validator, model_validator

from gateway.breakers import STATES, Breaker, guarded
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Settings
from gateway.response import GatewayResponse
from gateway.services import Services

Scope = Literal["upstream", "route", "none"]
# whose fault a route's failure status is: the calling tenant's, the anonymous tenant's (a route without a tenant
# provider on its upstream's shared breaker) or the breaker's own (a route without one, on a breaker of its own)
StatusOwner = Literal["tenant", "anonymous", "breaker"]


def _server_errors_only(value: list[int] | None) -> list[int] | None:
    if value is not None and any(not 500 <= s <= 599 for s in value):
        raise ValueError("only 5xx statuses may count as failures; a 4xx is the client's doing")
    return value


class CircuitBreakerSettings(Settings):
    fail_max: int = Field(5, ge=1, description="consecutive failures that open the breaker")
    reset_timeout_sec: float = Field(10.0, gt=0, description="how long it stays open before one trial")
    failure_statuses: list[int] = Field(default_factory=lambda: [500, 502, 503, 504])
    window_sec: float = Field(10.0, gt=0, description="failure statuses of two tenants within this reach the "
                                                      "shared breaker")

    _statuses = field_validator("failure_statuses")(_server_errors_only)


class RouteBreakerSettings(Settings):
    """How a route uses its upstream's breaker; settings here refine it for a breaker of the route's own."""

    scope: Scope = Field("upstream", description="upstream: the upstream's breaker, shared by its routes; route: "
                                                 "a breaker state of this route's own on the same upstream; none: "
                                                 "no breaker")
    fail_max: int | None = Field(None, ge=1, description="scope route: instead of the upstream's")
    reset_timeout_sec: float | None = Field(None, gt=0, description="scope route: instead of the upstream's")
    failure_statuses: list[int] | None = Field(None, description="scope route: instead of the upstream's")
    window_sec: float | None = Field(None, gt=0, description="scope route: instead of the upstream's")

    _statuses = field_validator("failure_statuses")(_server_errors_only)

    @model_validator(mode="after")
    def _refines_only_its_own(self) -> RouteBreakerSettings:
        if self.scope != "route" and self.model_fields_set - {"scope"}:
            raise ValueError("a route sets breaker settings only for a breaker of its own (scope: route); the "
                             "upstream's shared breaker is configured under upstreams.<name>.circuit_breaker")
        return self


@dataclass(frozen=True)
class BreakerUse:
    """The breaker a route's calls go through: its name (/admin/breakers, metrics), settings, and whose fault a
    failure status on the route is."""

    name: str
    settings: CircuitBreakerSettings
    status_owner: StatusOwner = "tenant"


def breaker_of(route: str, upstream: str, shared: CircuitBreakerSettings | None,
               refined: RouteBreakerSettings | None, has_tenant: bool = True) -> BreakerUse | None:
    """The breaker of route `route` to `upstream`, whose own breaker is `shared`; None: no breaker.
    `has_tenant`: a plugin of the route provides `tenant`."""
    if refined is None or refined.scope == "upstream":
        return BreakerUse(upstream, shared, "tenant" if has_tenant else "anonymous") if shared is not None else None
    if refined.scope == "none":
        return None
    own = refined.model_dump(exclude={"scope"}, exclude_none=True)
    return BreakerUse(f"{upstream}@{route}", (shared or CircuitBreakerSettings()).model_copy(update=own),
                      "tenant" if has_tenant else "breaker")


def observe(services: Services) -> None:
    services.metrics.observe_gauge("gateway_breaker_state", "0 closed, 1 half-open, 2 open", lambda: [
        (STATES.get(b.state, 2), {"upstream": name}) for name, b in services.breakers.by_upstream.items()])


class CircuitBreaker:
    def __init__(self, next: Handler, use: BreakerUse, services: Services) -> None:
        self.next = next
        self.failures = frozenset(use.settings.failure_statuses)
        s = use.settings
        # made (or given these settings) when the route is built: a reload applies new settings at once
        self.breaker: Breaker = services.breakers.get(use.name, s.fail_max, s.reset_timeout_sec, s.window_sec)
        for state in STATES:  # zero from the start, for an alert's rate()
            services.metrics.breaker_transitions.seed(use.name, state)
        # `tenant` is read only on a route where a plugin provides it
        self.reads_tenant = use.status_owner == "tenant"
        self.direct = use.status_owner == "breaker"

    def __call__(self, ctx: RequestContext) -> Awaitable[GatewayResponse]:
        """The call through the breaker, to await (an open breaker refuses at once, here)."""
        return guarded(self.breaker, lambda: self.next(ctx), self.failures,
                       ctx.tenant if self.reads_tenant else None, self.direct)
