"""The gateway's configuration, as read from config/gateway.yaml.

A route's `plugins` list holds its filters, run in the order written, and its
`policy` the upstream call's timeout and retry; an upstream's `circuit_breaker` is
the breaker its routes share (gateway/policy/). Each plugin entry is validated
against the plugin's own settings model, so a mistake is reported at its exact path
(routes[0].plugins[2].<plugin>.<setting>), and each route against the contracts its
plugins declare (`contract_problems`). A file in the older shape (the policy as
plugins) loads with one warning (gateway/legacy_config.py).
"""
from __future__ import annotations

import dataclasses
import re
import string
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.routing import compile_path

from exports_common import dev_mode
from exports_common.body_bounds import AnswerBytes, BodyBytes
from exports_common.config_loader import Loc, located
from exports_common.connection_limits import ConnectionLimits, networks
from exports_common.otel import TracingConfig
from gateway import legacy_config
from gateway.context import RequestContext
from gateway.forwarding import ForwardedHeader
from gateway.limiter import Quota
from gateway.plugin_config import PluginUse, validate_entries
from gateway.plugin_registry import registry
from gateway.plugins.base import Contract
from gateway.policy import RoutePolicy
from gateway.policy.circuit_breaker import BreakerUse, CircuitBreakerSettings, breaker_of
from gateway.refusal_hold import HoldSettings
from gateway.tenants import Limits, TenantLimits
from gateway.upstream import DEFAULT_MAX_ANSWER_BYTES

# plugins whose removal from a route takes a check away, besides the gatekeepers (auth, rate_limit, task_id)
CHECKS = frozenset({"signed_download", "validate", "list_query"})
MIN_ADMIN_TOKEN = 32  # outside dev mode: a guessed token is the whole admin API

# read once at start (the server, the Redis client and stores, tracing, the upstream client's pool): a reload
# that changes one applies everything else and says which of these wait for a restart
RESTART_ONLY = ("host", "port", "log_level", "max_header_bytes", "connection_limits", "redis_url", "redis_prefix",
                "state_dir", "tracing")
CONTEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(RequestContext))
HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def plugin_of(entry: PluginUse) -> tuple[str, BaseModel]:
    return entry.name, entry.settings


def providers(field: str, methods: tuple[str, ...]) -> list[str]:
    """The loaded plugins that provide `field` (with their default settings, where they have defaults)."""
    found = []
    for plugin in registry().active():
        try:
            contract = plugin.contract(plugin.Settings(), methods)
        except ValidationError:  # settings it cannot go without: what it provides whatever they are
            contract = Contract(provides=plugin.provides)
        if field in contract.provides | contract.defaults:
            found.append(plugin.name)
    return sorted(found)


def _missing(route: RouteConfig, name: str, field: str, after: list[tuple[str, Contract]]) -> str:
    """Why `name` cannot have `field`: a plugin listed after it provides it, or none of the route's plugins does
    (then which plugins would)."""
    later = next((other for other, c in after if field in c.provides | c.defaults), None)
    if later is not None:
        return (f"route `{route.name}`: {name} needs `{field}`, which {later} provides, but {later} is listed after "
                f"it: list {later} before {name}")
    known = [p for p in providers(field, tuple(route.methods)) if p != name]
    hint = f": list {' or '.join(known)} before it" if known else ""
    return f"route `{route.name}`: {name} needs `{field}`, which no earlier plugin provides{hint}"


def _contracts(route: RouteConfig) -> list[tuple[str, Contract]]:
    """Each of the route's plugins with its contract for these settings and the route's methods, in order."""
    methods = tuple(route.methods)
    return [(e.name, registry().get(e.name).contract(e.settings, methods)) for e in route.plugins]


def provided_by(route: RouteConfig) -> frozenset[str]:
    """The context fields the route's plugins set (provide, or default) before its upstream call."""
    return frozenset().union(*(c.provides | c.defaults for _, c in _contracts(route)))


def contract_problems(route: RouteConfig) -> list[tuple[Loc, str]]:
    """Each plugin's declared needs against what the plugins before it provide (gateway/plugins/base.py), and
    the upstream call's (it runs last); each problem with the path of the plugin (or policy) it is about."""
    problems: list[tuple[Loc, str]] = []
    provided: set[str] = set()
    minted_by: dict[str, str] = {}
    agreed: dict[str, tuple[str, object]] = {}
    chain = _contracts(route)
    for at, (name, contract) in enumerate(chain):
        here: Loc = ("plugins", at, name)
        for field in sorted((contract.needs | contract.provides | contract.defaults) - CONTEXT_FIELDS):
            problems.append((here, f"route `{route.name}`: {name} declares `{field}`, which is not a field of the "
                                   f"request context (gateway/context.py)"))
        for field in sorted(contract.needs - provided):
            problems.append((here, _missing(route, name, field, chain[at + 1:])))
        for field in sorted(contract.provides & minted_by.keys()):
            problems.append((here, f"route `{route.name}`: {name} sets `{field}`, so it must come before "
                                   f"{minted_by[field]}, which sets one only when no earlier plugin did"))
        for key, value in contract.agrees:
            first = agreed.setdefault(key, (name, value))
            if first[1] != value:
                problems.append((here, f"route `{route.name}`: {name}'s {key} ({value!r}) must equal {first[0]}'s "
                                       f"({first[1]!r})"))
        if contract.terminal and at < len(chain) - 1:
            problems.append((here, f"route `{route.name}`: {name} answers every request itself, so "
                                   f"{', '.join(n for n, _ in chain[at + 1:])} after it would never run: list it "
                                   f"last"))
        minted_by.update(dict.fromkeys(contract.defaults - provided, name))
        provided |= contract.provides | contract.defaults
    for field in sorted(route.policy.needs(tuple(route.methods)) - provided):
        problems.append((("policy", "retry"), _missing(route, "policy.retry", field, [])))
    return problems


class TimeoutsConfig(Strict):
    connect: float = Field(2.0, gt=0, description="seconds to open a connection")
    read: float = Field(30.0, gt=0, description="seconds to wait for each read of the answer")


UPSTREAM_URL = r"^https?://[^/\s]+/?$"


class OutlierConfig(Strict):
    """Passive health: an endpoint that keeps failing to connect is left out for a while."""

    consecutive_connect_failures: int = Field(3, ge=1, le=100, description="in a row, then the endpoint is ejected")
    base_ejection_sec: float = Field(10.0, gt=0, description="first ejection; each further one lasts this much longer")
    max_ejection_sec: float = Field(300.0, gt=0, description="the longest an endpoint is left out")


class ChangeFeedConfig(Strict):
    """The upstream's change feed (GET `path`, newline-delimited JSON: docs/backend-teams/backend-api.md), which
    each gateway process follows to push task changes to event streams. Optional in the upstream contract:
    an upstream that answers it 404, 405 or 501 has its watched tasks polled instead."""

    path: str = Field("/events", pattern=r"^/\S*$")
    silence_sec: float = Field(20.0, gt=0, le=300, description="a feed silent this long (the backend sends its "
                                                                 "position every few seconds) is dead: reconnect")
    reprobe_sec: float = Field(60.0, gt=0, description="an upstream without a feed is asked again this often")


class UpstreamConfig(Strict):
    url: str | None = Field(None, pattern=UPSTREAM_URL, description="scheme://host:port of a one-endpoint upstream")
    endpoints: list[Annotated[str, Field(pattern=UPSTREAM_URL)]] = Field(
        default_factory=list, description="scheme://host:port of each endpoint, instead of url")
    balance: Literal["round_robin", "least_requests"] = "round_robin"
    outlier_detection: OutlierConfig = Field(default_factory=OutlierConfig)
    pool_size: int = Field(200, ge=1, le=10_000, description="connections lent at once to each endpoint")
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    circuit_breaker: CircuitBreakerSettings | None = Field(
        None, description="one breaker for every route to this upstream (a route may have its own: "
                          "policy.circuit_breaker); none: no breaker")
    change_feed: ChangeFeedConfig | None = Field(
        default_factory=ChangeFeedConfig, description="the feed event streams follow; none: poll watched tasks")
    service_token: str = Field("", description=(
        "sent as 'Authorization: Bearer <token>' on every call to this upstream: the export backend's "
        "service_token (the shipped config reads EXPORT_BACKEND_TOKEN); empty: none. Only upstreams that are "
        "export backends get it"))

    def auth_headers(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.service_token}"),) if self.service_token else ()

    @model_validator(mode="after")
    def _one_way_to_name_endpoints(self) -> UpstreamConfig:
        if (self.url is None) == (not self.endpoints):
            raise ValueError("give either url or a non-empty endpoints list")
        return self

    @property
    def urls(self) -> list[str]:
        return [self.url] if self.url is not None else list(self.endpoints)


# a route without a timeout policy answers within this, or 504; one with answers within its total and this margin
DEFAULT_FIRST_BYTE_SEC = 60.0
PLUGINS_MARGIN_SEC = 5.0


class RouteConfig(Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    path: str = Field(description="public path; {name} matches one path segment")
    methods: list[str]
    upstream: str
    rewrite: str | None = Field(None, description="upstream path; may use the path's {params}")
    max_body_bytes: BodyBytes = Field(1_048_576, ge=0, description="a bigger request body gets 413")
    max_answer_bytes: AnswerBytes = Field(
        DEFAULT_MAX_ANSWER_BYTES, ge=1024, description="the most of an upstream answer a plugin reads whole (to sign "
        "links, cache or store it): a bigger one is a 502, its connection closed, nothing kept; streamed answers "
        "(downloads) are not bounded")
    first_byte_timeout_sec: float | None = Field(
        None, gt=0, description="the most seconds from a request's arrival to its answer's first byte, plugins "
        "included (past it: 504); none: the policy's timeout.total plus 5 s, or 60 s without one. A streamed body "
        "(a download, an event stream) keeps its own idle rules once it has started")
    plugins: list[PluginUse] = Field(default_factory=list, description="filters, run in the order written "
                                     "(the first sees the request first), the upstream call after the last")
    policy: RoutePolicy = Field(default_factory=RoutePolicy, description="the upstream call's timeout and retry, "
                                "and how it uses its upstream's circuit breaker")

    @property
    def first_byte_deadline(self) -> float:
        """Seconds from arrival to the answer's head: the route's policy's total bounds the upstream call, this
        the whole request. Later by the plugins' own work (a few store calls, each bounded by its own timeout),
        so that the policy's timeout, and what a plugin does about it (the outbox keeps a submit), comes first."""
        if self.first_byte_timeout_sec is not None:
            return self.first_byte_timeout_sec
        timeout = self.policy.timeout
        return timeout.total + PLUGINS_MARGIN_SEC if timeout is not None else DEFAULT_FIRST_BYTE_SEC

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugins(cls, value: Any, info: ValidationInfo) -> list[PluginUse]:
        return validate_entries(value, info.data.get("name", "?"))

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: list[str]) -> list[str]:
        upper = [m.upper() for m in value]
        unknown = sorted(set(upper) - HTTP_METHODS)
        if unknown or not upper:
            raise ValueError(f"methods must be a non-empty list of {sorted(HTTP_METHODS)}")
        return upper

    @model_validator(mode="after")
    def _contract(self) -> RouteConfig:
        problems = contract_problems(self)
        if problems:
            raise located("RouteConfig", problems)
        return self

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("path must start with /")
        compile_path(value)  # a duplicated {param} or an unknown {param:convertor} is refused here, not at match
        return value

    @field_validator("rewrite")
    @classmethod
    def _rewrite(cls, value: str | None, info: ValidationInfo) -> str | None:
        used = {field for _, field, _, _ in string.Formatter().parse(value or "") if field is not None}
        missing = used - set(compile_path(info.data.get("path", "/"))[2])
        if missing:
            raise ValueError(f"rewrite uses {sorted(missing)}, which the path does not define")
        if value is not None and not value.startswith("/"):
            raise ValueError(f"rewrite must start with / (it is the upstream path, after the upstream's URL): "
                             f"{value!r}")
        return value


class RateConfig(Strict):
    per_sec: float = Field(gt=0, description="requests per second, sustained")
    burst: int = Field(ge=1, description="requests admitted at once after a quiet spell (the bucket's size)")

    def quota(self) -> Quota:
        return Quota(self.per_sec, self.burst)


class TenantLimitsConfig(Strict):
    requests: RateConfig = Field(default_factory=lambda: RateConfig(per_sec=100, burst=200),
                                 description="requests on routes with rate_limit: {limit: requests}")
    submits: RateConfig = Field(default_factory=lambda: RateConfig(per_sec=20, burst=100),
                                description="submits (rate_limit: {limit: submits})")
    max_active_tasks: int = Field(1000, ge=1, description="PENDING or RUNNING tasks at once; the backend enforces it")
    max_outbox_entries: int = Field(1000, ge=1, description="submits held in the outbox while the backend is down")
    max_open_streams: int = Field(1000, ge=1, description="event streams open at once, over every gateway when "
                                                          "Redis is configured")


class TenantLimitsOverride(Strict):
    """A tier: the fields set here replace the defaults in tenant_limits for this tenant."""

    requests: RateConfig | None = None
    submits: RateConfig | None = None
    max_active_tasks: int | None = Field(None, ge=1)
    max_outbox_entries: int | None = Field(None, ge=1)
    max_open_streams: int | None = Field(None, ge=1)


class TenantConfig(Strict):
    api_key_hashes: list[str] = Field(description='"sha256:<hex>" of each API key; never the key itself')
    limits: TenantLimitsOverride = Field(default_factory=TenantLimitsOverride)

    @field_validator("api_key_hashes")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        for item in value:
            if not re.fullmatch(r"sha256:[0-9a-fA-F]{64}", item):
                raise ValueError('each entry must be "sha256:" and 64 hex digits (python -m gateway hash-key KEY)')
        return value


class SigningConfig(Strict):
    secrets: list[str] = Field(min_length=1, description="the first signs; all verify (rotation)")
    max_link_ttl_sec: int = Field(259_200, ge=60, description="a link expiring later than now + this is refused "
                                                                "(403); links are signed to expire no later")

    @field_validator("secrets")
    @classmethod
    def _long_enough(cls, value: list[str]) -> list[str]:
        if any(len(s) < 16 for s in value):
            raise ValueError("each signing secret must be at least 16 characters")
        return value


class GatewayConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    public_base_url: str = Field("", pattern=r"^(https?://[^/\s?#]+(/[^\s?#]*)?)?$",
                                 description="base of the links the gateway hands out; required outside dev mode "
                                             "(in dev mode, empty: a trusted proxy's forwarded host, else the "
                                             "gateway's own address)")
    trusted_proxies: list[str] = Field(default_factory=list, description="CIDRs whose Forwarded / X-Forwarded-* "
                                       "headers are believed; anyone else's are dropped")
    forwarded_header: ForwardedHeader = Field(
        "auto", description="the header the nearest trusted proxy writes the client's address in; auto: whichever "
                            "of the two a request carries, and neither when it carries both (the trusted peer's "
                            "own address counts), since a client can add the one its proxy does not write")
    max_header_bytes: int = Field(8192, ge=1024, le=65536, description="larger request headers get 431")
    connection_limits: ConnectionLimits = Field(default_factory=ConnectionLimits)
    metrics_auth: Literal["none", "admin_token"] = Field(
        "none", description="admin_token: /metrics wants the admin token like /admin/*")
    state_dir: str = ".data/gateway"
    redis_url: str = Field("", description="empty: memory and a local file; set: state shared through Redis "
                           "(redis://HOST:PORT/DB, or redis+cluster://HOST:PORT for a Redis Cluster)")
    redis_prefix: str = "gw"
    admin_token: str = Field(min_length=8)
    download_signing: SigningConfig
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    tenant_limits: TenantLimitsConfig = Field(default_factory=TenantLimitsConfig,
                                              description="every tenant's limits unless tenants.<name>.limits says")
    address_limit: RateConfig = Field(default_factory=lambda: RateConfig(per_sec=20, burst=50),
                                      description="requests without a valid API key, per client address")
    gateway_processes: int = Field(1, ge=1, description="gateway processes sharing the limits; with Redis "
                                                        "unreachable each enforces limit / this locally")
    refusal_hold: HoldSettings = Field(default_factory=HoldSettings,
                                       description="a flood's 429s are answered later (gateway/refusal_hold.py)")
    upstreams: dict[str, UpstreamConfig]
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    access_log: bool = Field(False, description="one JSON line per request (logger gateway.access)")
    shutdown_timeout_sec: int = Field(30, ge=1, le=3600, description="on SIGTERM, event streams end at once "
                                        "and other open requests get at most this long to finish")
    routes: list[RouteConfig]
    # what the file should change though it loads (an older shape), for check-config, start and reload to say
    _load_warnings: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _older_shape(cls, data: Any, handler: ModelWrapValidatorHandler[GatewayConfig]) -> GatewayConfig:
        if not legacy_config.is_older_shape(data):
            return handler(data)
        config, warning = legacy_config.load(data, cls, handler)
        config._load_warnings = [warning]
        return config

    def load_warnings(self) -> list[str]:
        deprecated = [f"route {route.name}: {warning}" for route in self.routes for entry in route.plugins
                      for warning in registry().get(entry.name).deprecations(entry.settings)]
        return [*self._load_warnings, *deprecated]

    def breaker_of(self, route: RouteConfig) -> BreakerUse | None:
        """The breaker route `route`'s calls go through (None: none)."""
        return breaker_of(route.name, route.upstream, self.upstreams[route.upstream].circuit_breaker,
                          route.policy.circuit_breaker, "tenant" in provided_by(route))

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        networks(value)
        return value

    def unsafe_defaults(self) -> list[str]:
        """What makes this config unfit outside dev mode, each with what to set instead."""
        problems = []
        if not self.public_base_url:
            problems.append("public_base_url is empty: set GATEWAY_PUBLIC_URL to the URL clients reach the gateway at")
        if self.admin_token == dev_mode.DEV_ADMIN_TOKEN:
            problems.append("admin_token is the published default: set GATEWAY_ADMIN_TOKEN to a random secret")
        elif len(self.admin_token) < MIN_ADMIN_TOKEN:
            problems.append(f"admin_token has {len(self.admin_token)} characters, fewer than {MIN_ADMIN_TOKEN}: set "
                            f"GATEWAY_ADMIN_TOKEN to {MIN_ADMIN_TOKEN}+ random characters (openssl rand -base64 32)")
        if dev_mode.DEV_SIGNING_SECRET in self.download_signing.secrets:
            problems.append("download_signing.secrets holds the published dev secret: set DOWNLOAD_SIGNING_SECRET "
                            "(the same value in the backend's config)")
        for tenant, conf in self.tenants.items():
            if dev_mode.DEMO_KEY_HASHES & {h.lower() for h in conf.api_key_hashes}:
                problems.append(f"tenants.{tenant} accepts a published demo API key: replace its api_key_hashes "
                                "(python -m gateway hash-key <new key>)")
        return problems

    def removals(self, running: GatewayConfig) -> list[str]:
        """What this config takes away from `running`: its routes, and plugins of routes it keeps.

        A file caught half-written (truncated mid-save) reads as a valid config with less in it:
        a reload from the watcher or SIGHUP refuses these, and an operator applies them on purpose.
        """
        routes = {route.name: route for route in self.routes}
        removed = [f"route {old.name}" for old in running.routes if old.name not in routes]
        for old in running.routes:
            if old.name in routes:
                kept = {entry.name for entry in routes[old.name].plugins}
                removed += [f"plugin {entry.name} of route {old.name}" for entry in old.plugins
                            if entry.name not in kept]
        return removed

    def weakenings(self, running: GatewayConfig) -> list[str]:
        """The security settings this config weakens, compared with `running`, one sentence each."""
        weaker = []
        if running.metrics_auth == "admin_token" and self.metrics_auth == "none":
            weaker.append("metrics_auth: admin_token -> none (/metrics answers without the admin token)")
        routes = {route.name: route for route in self.routes}
        for old in running.routes:
            new = routes.get(old.name)
            if new is None:
                continue
            kept = {entry.name: entry for entry in new.plugins}
            for entry in old.plugins:
                if entry.name not in kept and (registry().get(entry.name).gatekeeper or entry.name in CHECKS):
                    weaker.append(f"routes.{old.name}: {entry.name} removed (requests pass without its check)")
                elif (entry.name == "auth" and entry.name in kept and getattr(entry.settings, "required", True)
                      and not getattr(kept[entry.name].settings, "required", True)):
                    weaker.append(f"routes.{old.name}: auth.required true -> false (anonymous requests pass)")
        widened = [net for net in self.trusted_proxies if net not in running.trusted_proxies]
        if widened:
            weaker.append(f"trusted_proxies: {', '.join(widened)} added (their forwarding headers are believed)")
        return weaker

    def restart_required(self, running: GatewayConfig) -> list[str]:
        """The paths of settings that differ from `running`'s but are read only at start."""
        return [path for path in RESTART_ONLY if getattr(self, path) != getattr(running, path)]

    def pool_sizes(self) -> dict[str, int]:
        """Each endpoint origin's bound on connections: its upstream's pool_size (the largest, for an origin
        that upstreams share)."""
        sizes: dict[str, int] = {}
        for upstream in self.upstreams.values():
            for url in upstream.urls:
                origin = url.rstrip("/")
                sizes[origin] = max(sizes.get(origin, 0), upstream.pool_size)
        return sizes

    def limits(self) -> Limits:
        base = self.tenant_limits
        by_tenant = {}
        for name, tenant in self.tenants.items():
            over = tenant.limits
            by_tenant[name] = TenantLimits(
                requests=(over.requests or base.requests).quota(), submits=(over.submits or base.submits).quota(),
                max_active_tasks=over.max_active_tasks or base.max_active_tasks,
                max_outbox_entries=over.max_outbox_entries or base.max_outbox_entries,
                max_open_streams=over.max_open_streams or base.max_open_streams,
            )
        return Limits(by_tenant, self.address_limit.quota(), self.gateway_processes, self.refusal_hold)

    @model_validator(mode="after")
    def _references(self) -> GatewayConfig:
        problems: list[tuple[Loc, str]] = []
        named: dict[str, int] = {}
        for i, route in enumerate(self.routes):
            first = named.setdefault(route.name, i)
            if first != i:
                problems.append((("routes", i, "name"), f"route name {route.name!r} is taken by routes[{first}]; "
                                                        "each route needs a name of its own"))
            upstream = self.upstreams.get(route.upstream)
            if upstream is None:
                problems.append((("routes", i, "upstream"), f"route {route.name!r} names upstream "
                                                            f"{route.upstream!r}, which is not among "
                                                            f"{sorted(self.upstreams)}"))
            elif upstream.circuit_breaker is None and route.policy.circuit_breaker is not None \
                    and route.policy.circuit_breaker.scope == "upstream":
                problems.append((("routes", i, "policy", "circuit_breaker", "scope"),
                                 f"route {route.name!r} asks for the breaker of upstream {route.upstream!r}, which "
                                 f"has none: set upstreams.{route.upstream}.circuit_breaker, or give the route its "
                                 "own with scope: route"))
        problems += self._route_references()
        if problems:
            raise located("GatewayConfig", problems)
        return self

    def _route_references(self) -> list[tuple[Loc, str]]:
        """Every route a plugin names (the route whose answers a stream carries) exists and serves GET."""
        problems: list[tuple[Loc, str]] = []
        by_name = {r.name: r for r in self.routes}
        for i, route in enumerate(self.routes):
            for at, (name, contract) in enumerate(_contracts(route)):
                for named in contract.routes:
                    target = by_name.get(named)
                    if target is None or "GET" not in target.methods:
                        problems.append((("routes", i, "plugins", at, name),
                                         f"route `{route.name}`: {name} names route {named!r}, which is not "
                                         f"a GET route of this config (routes: {sorted(by_name)})"))
        return problems


def workers_refusal(config: GatewayConfig, workers: int) -> str | None:
    """Why `run --workers N` cannot serve this config, with what to set; None when it can.

    The embedded default keeps the status cache and the limits in process memory and the
    idempotency keys and outbox in a local SQLite file: N workers would each keep their own.
    """
    if not config.redis_url:
        return (f"--workers {workers} needs redis_url (REDIS_URL): without Redis the status cache, the tenant "
                "limits, idempotency keys and the outbox live in one process; run one worker, or set REDIS_URL")
    if config.gateway_processes < workers:
        return (f"--workers {workers} needs gateway_processes (GATEWAY_PROCESSES) >= {workers}: with Redis "
                "unreachable each process enforces limit / gateway_processes, so count every worker of every host")
    return None
