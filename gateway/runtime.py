"""Everything built from one config: the router, and a plugin chain per route.

The app holds exactly one Runtime and swaps it whole on reload, so a request
runs entirely on the config that was in force when it arrived.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from starlette.routing import compile_path

from exports_common.signing import DownloadSigner
from gateway.answer_view import AnswerView, HeldAnswer
from gateway.config import GatewayConfig, RouteConfig, UpstreamConfig
from gateway.context import Handler
from gateway.forwarding import TrustedProxies
from gateway.plugin_registry import registry
from gateway.plugins.base import Gatekeeper, RouteInfo, gatekeepers
from gateway.policy import upstream_call
from gateway.policy.circuit_breaker import BreakerUse
from gateway.proxy import Proxy
from gateway.router import Router
from gateway.services import Services, Upstream
from gateway.telemetry import Metrics
from gateway.tenants import TenantDirectory
from gateway.upstream import EndpointPool, FeedSettings, OutlierPolicy, Timeouts


@dataclass(frozen=True)
class Runtime:
    config: GatewayConfig
    services: Services
    router: Router
    chains: dict[str, Handler]
    deadlines: dict[str, float]  # each route's first-byte deadline (seconds from arrival), by route name



def upstreams_of(config: GatewayConfig, metrics: Metrics) -> dict[str, Upstream]:
    def pool(name: str, u: UpstreamConfig) -> EndpointPool:
        outlier = u.outlier_detection
        policy = OutlierPolicy(outlier.consecutive_connect_failures, outlier.base_ejection_sec,
                               outlier.max_ejection_sec)
        return EndpointPool(u.urls, u.balance, policy, on_eject=lambda url: metrics.ejections.add(name, url))

    def feed(u: UpstreamConfig) -> FeedSettings | None:
        f = u.change_feed
        return FeedSettings(f.path, f.silence_sec, f.reprobe_sec) if f is not None else None

    return {
        name: Upstream(name, pool(name, u), Timeouts(connect=u.timeouts.connect, read=u.timeouts.read), feed(u),
                       u.auth_headers())
        for name, u in config.upstreams.items()
    }


def build_chain(route: RouteConfig, breaker: BreakerUse | None, services: Services,
                last: Handler | None = None, views: RouteViews | None = None, held: bool = False) -> Handler:
    """The route's plugins in their YAML order, outermost first, and its upstream call after the last.

    The upstream call is the route's policy and `breaker` (GatewayConfig.breaker_of) around the
    proxy (gateway/policy/); a plugin that makes a call of its own (rerun) goes through the same
    call. `last` stands in for the proxy (gateway.testing ends a chain in a recorder). `held`
    builds the route's answer view instead (gateway/answer_view.py): its gatekeepers left out,
    ending in the held state or the upstream call. Consecutive gatekeepers run as one handler
    (gateway/plugins/base.py: `Gatekeepers`).
    """
    methods = tuple(route.methods)
    proxy = last or Proxy(services.upstreams[route.upstream], services, route.max_body_bytes,
                          breaker.name if breaker is not None else None, route.max_answer_bytes)
    call = upstream_call(proxy, route.policy, breaker, services, RouteInfo(route.name, route.upstream, methods, proxy))
    info = RouteInfo(route.name, route.upstream, methods, call, views.get if views is not None else None)
    handler: Handler = HeldAnswer(call) if held else call
    gates: list[Gatekeeper[Any]] = []  # the consecutive gatekeepers built last, outermost first: run as one
    for entry in reversed(route.plugins):
        plugin = registry().get(entry.name)
        if held and plugin.gatekeeper:
            continue
        if not issubclass(plugin, Gatekeeper):
            handler, gates = gatekeepers(gates, handler), []
        handler = plugin(handler, entry.settings, services, info)
        if isinstance(handler, Gatekeeper):
            gates.insert(0, handler)
    return gatekeepers(gates, handler)


class RouteViews:
    """Each route's answer view, built the first time a plugin asks for it (by route name)."""

    def __init__(self, config: GatewayConfig, services: Services) -> None:
        self.config = config
        self.services = services
        self._built: dict[str, AnswerView] = {}

    def get(self, name: str) -> AnswerView:
        view = self._built.get(name)
        if view is None:
            route = next(r for r in self.config.routes if r.name == name)  # the config check named it
            param = compile_path(route.path)[2]
            handler = build_chain(route, self.config.breaker_of(route), self.services, views=self, held=True)
            view = self._built[name] = AnswerView(name, route.upstream, next(iter(param), "task_id"),
                                                  route.rewrite or route.path, handler)
        return view


def build_runtime(config: GatewayConfig, services: Services) -> Runtime:
    """A runtime for `config`, sharing the long-lived parts (client, stores, metrics) of `services`."""
    services = dataclasses.replace(
        services,
        tenants=TenantDirectory({t: c.api_key_hashes for t, c in config.tenants.items()}, config.limits()),
        signer=DownloadSigner(config.download_signing.secrets, config.download_signing.max_link_ttl_sec),
        upstreams=upstreams_of(config, services.metrics),
        public_base_url=config.public_base_url.rstrip("/"),
        trusted_proxies=TrustedProxies(config.trusted_proxies, config.forwarded_header),
    )
    services.client.resize(config.pool_sizes())
    views = RouteViews(config, services)
    chains = {route.name: build_chain(route, config.breaker_of(route), services, views=views)
              for route in config.routes}
    return Runtime(config, services, Router(config.routes), chains,
                   {route.name: route.first_byte_deadline for route in config.routes})
