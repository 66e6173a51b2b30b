"""Everything built from one config: the router, and a plugin chain per route.

The app holds exactly one Runtime and swaps it whole on reload, so a request
runs entirely on the config that was in force when it arrived.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from exports_common.signing import DownloadSigner
from gateway.config import GatewayConfig, RouteConfig, UpstreamConfig
from gateway.context import Handler
from gateway.forwarding import TrustedProxies
from gateway.plugin_registry import registry
from gateway.plugins.base import RouteInfo
from gateway.policy import upstream_call
from gateway.policy.circuit_breaker import BreakerUse
from gateway.proxy import Proxy
from gateway.router import Router
from gateway.services import Services, Upstream
from gateway.telemetry import Metrics
from gateway.tenants import TenantDirectory
from gateway.upstream import EndpointPool, OutlierPolicy, Timeouts


@dataclass(frozen=True)
class Runtime:
    config: GatewayConfig
    services: Services
    router: Router
    chains: dict[str, Handler]


def upstreams_of(config: GatewayConfig, metrics: Metrics) -> dict[str, Upstream]:
    def pool(name: str, u: UpstreamConfig) -> EndpointPool:
        outlier = u.outlier_detection
        policy = OutlierPolicy(outlier.consecutive_connect_failures, outlier.base_ejection_sec,
                               outlier.max_ejection_sec)
        return EndpointPool(u.urls, u.balance, policy, on_eject=lambda url: metrics.ejections.add(name, url))

    return {
        name: Upstream(name, pool(name, u), Timeouts(connect=u.timeouts.connect, read=u.timeouts.read))
        for name, u in config.upstreams.items()
    }


def build_chain(route: RouteConfig, breaker: BreakerUse | None, services: Services,
                last: Handler | None = None) -> Handler:
    """The route's plugins in their YAML order, outermost first, and its upstream call after the last.

    The upstream call is the route's policy and `breaker` (GatewayConfig.breaker_of) around the
    proxy (gateway/policy/); a plugin that makes a call of its own (rerun) goes through the same
    call. `last` stands in for the proxy (gateway.testing ends a chain in a recorder).
    """
    methods = tuple(route.methods)
    proxy = last or Proxy(services.upstreams[route.upstream], services, route.max_body_bytes,
                          breaker.name if breaker is not None else None)
    call = upstream_call(proxy, route.policy, breaker, services, RouteInfo(route.name, route.upstream, methods, proxy))
    info = RouteInfo(route.name, route.upstream, methods, call)
    handler = call
    for entry in reversed(route.plugins):
        handler = registry().get(entry.name)(handler, entry.settings, services, info)
    return handler


def build_runtime(config: GatewayConfig, services: Services) -> Runtime:
    """A runtime for `config`, sharing the long-lived parts (client, stores, metrics) of `services`."""
    services = dataclasses.replace(
        services,
        tenants=TenantDirectory({t: c.api_key_hashes for t, c in config.tenants.items()}, config.limits()),
        signer=DownloadSigner(config.download_signing.secrets, config.download_signing.max_link_ttl_sec),
        upstreams=upstreams_of(config, services.metrics),
        public_base_url=config.public_base_url.rstrip("/"),
        trusted_proxies=TrustedProxies(config.trusted_proxies),
    )
    services.client.resize(config.pool_sizes())
    chains = {route.name: build_chain(route, config.breaker_of(route), services) for route in config.routes}
    return Runtime(config, services, Router(config.routes), chains)
