"""backend.yaml reloaded while the backend runs: on an edit of the file, SIGHUP, or POST /internal/reload.

The export types and the callback allow-list apply at once (backend_stub.registry; an
attempt already running keeps the type it started with). Every other setting keeps its
value from the start until a restart, and the reload says which changed. A file that
does not validate, or brings back a published secret outside dev mode, is refused and
the config in force keeps serving. A file that removes export types is refused too
unless an operator asks for it (`POST /internal/reload?allow_removals=true`): a file
read while it is being written looks like one with less in it. The file is read and
validated off the event loop, so a reload never stalls requests and workers.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend_stub import metrics
from backend_stub.registry import Registry
from exports_common import config_watch, dev_mode
from exports_common.config_loader import ConfigError
from exports_common.envelope import ok
from exports_common.errors import ApiError, ErrorKind, validation_error

log = logging.getLogger("backend.config")
Trigger = Literal["watcher", "sighup", "admin"]


@dataclass(frozen=True)
class Reload:
    problems: list[str]
    restart_required: list[str] = field(default_factory=list)
    removals: list[str] = field(default_factory=list)


class ConfigReloader:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = asyncio.Lock()

    def routes(self) -> list[Route]:
        return [Route("/internal/reload", self.endpoint, methods=["POST"])]

    def arm_sighup(self, tasks: set[asyncio.Task[Reload]]) -> None:
        def on_sighup() -> None:
            tasks.add(task := asyncio.create_task(self.reload("sighup")))
            task.add_done_callback(tasks.discard)
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
        except (NotImplementedError, RuntimeError):
            pass

    async def watch(self) -> None:
        if self.registry.path:
            async for _ in config_watch.changes(self.registry.path):
                await self.reload("watcher")

    async def endpoint(self, request: Request) -> Response:
        allow = request.query_params.get("allow_removals", "false").lower()
        if allow not in ("true", "false"):
            raise validation_error("allow_removals", "must be true or false")
        outcome = await self.reload("admin", allow_removals=allow == "true")
        if outcome.problems:
            raise ApiError(ErrorKind.VALIDATION, "the new config was refused; the one in force keeps serving",
                           data={"problems": outcome.problems, "removals": outcome.removals})
        return ok({"reloaded": True, "export_types": sorted(self.registry.current.types),
                   "restart_required": outcome.restart_required})

    async def reload(self, trigger: Trigger, allow_removals: bool = False) -> Reload:
        if not self.registry.path:
            return Reload(["the backend was started without a config file"])
        async with self._lock:
            return await self._reload(trigger, allow_removals)

    def _refused(self, outcome: str, message: str, problems: list[str], trigger: Trigger) -> None:
        metrics.config_reloads.labels(outcome).inc()
        log.error(message, extra={"problems": problems, "trigger": trigger})

    async def _reload(self, trigger: Trigger, allow_removals: bool) -> Reload:
        try:
            new, snapshot = await asyncio.to_thread(self.registry.read)
        except ConfigError as exc:
            self._refused("refused", "config reload refused; the config in force keeps serving", exc.problems,
                          trigger)
            return Reload(exc.problems)
        unsafe = [] if dev_mode.dev_mode() else new.unsafe_defaults()
        if unsafe:
            self._refused("refused", "config reload refused outside dev mode; the config in force keeps serving",
                          unsafe, trigger)
            return Reload(unsafe)
        removed = [f"export type {name}" for name in self.registry.current.types if name not in snapshot.types]
        if removed and not allow_removals:
            self._refused("refused_removals", "config reload refused: it removes export types, as a file read while "
                          "it is being written would; the config in force keeps serving. To remove them, write the "
                          "file whole (a new file renamed over it), then POST /internal/reload?allow_removals=true, "
                          "or restart", removed, trigger)
            return Reload([f"removes {what} (apply on purpose with POST /internal/reload?allow_removals=true, or "
                           f"restart)" for what in removed], removals=removed)
        changed = snapshot != self.registry.current
        restart = self.registry.apply(new, snapshot)
        if changed:
            metrics.config_reloads.labels("applied").inc()
            log.info("config reloaded", extra={"trigger": trigger, "removals": removed})
        if restart:
            log.warning("config reloaded, but these settings keep their value from the start until a restart",
                        extra={"restart_required": restart})
        return Reload([], restart)
