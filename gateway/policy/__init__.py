"""A route's upstream call: its policy (timeout, retry) and its upstream's breaker around the proxy.

Envoy's split: retry and timeout are route config (`routes[].policy`), the circuit
breaker is upstream config (`upstreams.<name>.circuit_breaker`, which a route may
refine). The call is the last handler of the route's chain, after every plugin,
and always runs in one order, whatever the YAML's: the timeout outermost (`total`
covers every try and backoff), then retry (within its upstream's budget), then the
breaker (each try is one call it judges), then the proxy. A plugin that makes a
call of its own (rerun) goes through the same call (`RouteInfo.call_upstream`).
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.context import Handler
from gateway.plugins.base import RouteInfo, Settings
from gateway.policy import circuit_breaker, retry
from gateway.policy.circuit_breaker import BreakerUse, CircuitBreaker, RouteBreakerSettings
from gateway.policy.retry import Retry, RetrySettings
from gateway.policy.timeout import Timeout, TimeoutSettings
from gateway.services import Services


class RoutePolicy(Settings):
    timeout: TimeoutSettings | None = Field(None, description="none: the upstream's own connect and read timeouts, "
                                                              "no total")
    retry: RetrySettings | None = Field(None, description="none: one try")
    circuit_breaker: RouteBreakerSettings | None = Field(
        None, description="none: the upstream's breaker (upstreams.<name>.circuit_breaker), if it has one")

    def needs(self, methods: tuple[str, ...]) -> frozenset[str]:
        """The context fields the call reads, which the route's plugins must provide. The breaker's `tenant` is
        none of them: it is read only on a route where a plugin provides it (circuit_breaker.breaker_of)."""
        return retry.needs(self.retry, methods) if self.retry is not None else frozenset()


def upstream_call(proxy: Handler, policy: RoutePolicy, breaker: BreakerUse | None, services: Services,
                  route: RouteInfo) -> Handler:
    call = proxy
    if breaker is not None:
        call = CircuitBreaker(call, breaker, services)
    if policy.retry is not None:
        call = Retry(call, policy.retry, services, route)
    if policy.timeout is not None:
        call = Timeout(call, policy.timeout)
    return call


def observe(services: Services) -> None:
    """The policy's gauges, read at scrape time (once per process)."""
    retry.observe(services)
    circuit_breaker.observe(services)


def stats(services: Services) -> dict[str, Any]:
    """The policy's part of /admin/stats."""
    return retry.stats(services)
