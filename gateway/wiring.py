"""The gateway's long-lived wiring: the services built at start, the Runtime in force, reload and its triggers.

`RuntimeHolder` is the one place that knows which Runtime serves: dispatch and the
operations endpoints read it, reload swaps it whole.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import signal
from dataclasses import dataclass, field
from typing import AsyncIterator, Literal

from exports_common import config_watch, dev_mode, otel, periodic
from exports_common.config_loader import ConfigError, load_model
from exports_common.redis_client import learn_cluster
from exports_common.signing import DownloadSigner
from gateway import plugin_hooks, policy, telemetry
from gateway.breakers import Breakers
from gateway.config import GatewayConfig
from gateway.http_client import HttpClient
from gateway.limiter import Limiter
from gateway.plugin_registry import registry
from gateway.runtime import Runtime, build_runtime, upstreams_of
from gateway.services import Services, State, open_redis
from gateway.tenants import TenantDirectory

log = logging.getLogger("gateway")


@dataclass(frozen=True)
class Reload:
    """A reload's outcome: why it was refused, or which changed settings wait for a restart."""

    problems: list[str]
    restart_required: list[str] = field(default_factory=list)
    # what the refused config would have removed (routes, plugins): applied only on purpose
    removals: list[str] = field(default_factory=list)


# what asked for a reload: the file watcher, SIGHUP, or an operator's POST /admin/reload
Trigger = Literal["watcher", "sighup", "admin"]


class RuntimeHolder:
    """The Runtime in force, and how a new config replaces it."""

    def __init__(self, config: GatewayConfig, config_path: str | None) -> None:
        self.initial_config = config
        self.config_path = config_path
        self._runtime: Runtime | None = None
        self.config_hash = ""
        # the file as it was at start (without --host/--port): what restart-only settings are compared with
        self._started_file = self._load() or config

    def _load(self) -> GatewayConfig | None:
        try:
            return load_model(self.config_path, GatewayConfig) if self.config_path else None
        except ConfigError:
            return None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("the gateway has not started")
        return self._runtime

    def apply(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.config_hash = hashlib.sha256(runtime.config.model_dump_json().encode()).hexdigest()[:16]
        runtime.services.metrics.seed([(r.name, r.upstream) for r in runtime.config.routes])

    async def watch_config(self) -> None:
        if self.config_path:
            async for _ in config_watch.changes(self.config_path):
                await self.reload("watcher")

    async def reload(self, trigger: Trigger = "admin", allow_removals: bool = False) -> Reload:
        """Load the config file again; a config that does not validate is refused and the old one kept.

        A config that removes routes or plugins is refused too unless `allow_removals` (an operator's
        `POST /admin/reload?allow_removals=true`): a file read mid-write looks like one with less in it.
        """
        if not self.config_path:
            return Reload(["the gateway was started without a config file"])
        try:
            # off the event loop: reading and validating a large file must not stall the requests in flight
            config = await asyncio.to_thread(load_model, self.config_path, GatewayConfig)
        except ConfigError as exc:
            log.error("config reload refused; the config in force keeps serving", extra={"problems": exc.problems})
            self.runtime.services.metrics.config_reloads.add("refused")
            return Reload(exc.problems)
        unsafe = [] if dev_mode.dev_mode() else config.unsafe_defaults()
        if unsafe:
            self.runtime.services.metrics.config_reloads.add("refused")
            log.error("config reload refused outside dev mode; the config in force keeps serving",
                      extra={"problems": unsafe})
            return Reload(unsafe)
        for warning in config.load_warnings():
            log.warning("config reloaded with a warning", extra={"warning": warning})
        restart = config.restart_required(self._started_file)
        running = self.runtime.config
        if config == running:  # the watcher and a SIGHUP or /admin/reload may both see one edit
            return Reload([], restart)
        removed = config.removals(running)
        if removed and not allow_removals:
            self.runtime.services.metrics.config_reloads.add("refused_removals")
            log.error("config reload refused: it removes what the config in force serves, as a file read while "
                      "it is being written would; the config in force keeps serving. To remove them, write the "
                      "file whole (a new file renamed over it), then POST /admin/reload?allow_removals=true, or "
                      "restart", extra={"trigger": trigger, "removals": removed})
            return Reload([f"removes {what} (apply on purpose with POST /admin/reload?allow_removals=true, or "
                           f"restart)" for what in removed], removals=removed)
        for weakened in config.weakenings(running):
            log.warning("config reload weakens security", extra={"setting": weakened, "trigger": trigger})
        self.apply(build_runtime(config, self.runtime.services))
        self.runtime.services.metrics.config_reloads.add("applied")
        log.info("config reloaded", extra={"routes": len(config.routes), "config_hash": self.config_hash,
                                           "trigger": trigger, "removals": removed})
        if restart:
            log.warning("config reloaded, but these settings keep their value from the start until a restart",
                        extra={"restart_required": restart})
        return Reload([], restart)

    def observe(self, services: Services) -> None:
        """The gauges read at scrape time: the gateway's own, the upstream call's, then each plugin's."""
        services.metrics.observe_gauge("gateway_config_info", "the config in force: its hash (1 while it serves)",
                                       lambda: [(1.0, {"hash": self.config_hash})])
        policy.observe(services)
        plugin_hooks.observe(services)


def open_services(config: GatewayConfig) -> Services:
    """The long-lived parts every Runtime shares: the upstream client, stores, metrics, tracing."""
    metrics, tracing = telemetry.setup("gateway", config.tracing)
    redis = open_redis(config.redis_url)
    return Services(
        client=upstream_client(config), metrics=metrics, tracing=tracing, tenants=TenantDirectory({}),
        signer=DownloadSigner(config.download_signing.secrets, config.download_signing.max_link_ttl_sec),
        upstreams=upstreams_of(config, metrics),
        state=State(redis, config.redis_prefix, config.state_dir), breakers=Breakers(metrics),
        limiter=Limiter(redis, config.redis_prefix),
    )


def upstream_client(config: GatewayConfig) -> HttpClient:
    """Each endpoint's pool bounded by its upstream's pool_size (upstreams sharing an origin share its pool, the
    largest bound); each Runtime built later bounds them by its own config (`resize`)."""
    sizes = config.pool_sizes()
    return HttpClient(max(sizes.values()), pool_sizes=sizes)


@contextlib.asynccontextmanager
async def running(holder: RuntimeHolder) -> AsyncIterator[None]:
    """From start to shutdown: services open, the first Runtime in force, reload triggers armed."""
    services = open_services(holder.initial_config)
    if services.state.redis is not None:
        await learn_cluster(services.state.redis)
    if unloaded := registry().unloaded():  # a broken package no route names costs nothing: it is not imported
        log.info("installed plugins no route names are not loaded", extra={"plugins": unloaded})
    holder.observe(services)
    holder.apply(build_runtime(holder.initial_config, services))
    # what start-up built (modules, config, plugin chains) lives as long as the process: kept out of every
    # later collection, so that a full one walks only what requests left, which shortens the pauses in p99
    gc.freeze()
    # the plugins' background work (the outbox's drainer) runs on whatever services are in force
    background = plugin_hooks.background(lambda: holder.runtime.services)
    # one of several workers (run --workers N): its gauges written for whichever worker is scraped
    if telemetry.multiprocess_dir() is not None:
        background.append(services.metrics.refresh_gauges_forever())
    reloads: set[asyncio.Task[Reload]] = set()  # held until done: the loop keeps tasks weakly

    def on_sighup() -> None:
        reloads.add(reload := asyncio.create_task(holder.reload("sighup")))
        reload.add_done_callback(reloads.discard)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
    try:
        async with periodic.running(holder.watch_config(), *background):
            yield
    finally:
        await services.client.close()
        otel.shutdown()
        if services.state.redis is not None:
            await services.state.redis.aclose()

