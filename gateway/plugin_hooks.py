"""The plugins' process-wide hooks (background work, gauges, scrape refresh, stats), each run apart.

Hooks run for the built-in plugins and for the installed plugins a route has named
(the registry imports a package's plugin only then). A hook that raises is logged
once, with the plugin and the hook named, and its part is skipped: the other
plugins' background work goes on, `/metrics` and `/admin/stats` still answer with
everything else.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from gateway.plugin_registry import registry
from gateway.plugins.base import CurrentServices, Plugin
from gateway.services import Services

log = logging.getLogger("gateway.plugins")
_reported: set[tuple[str, str]] = set()


def failed(plugin: str, hook: str, exc: BaseException) -> None:
    """Log a hook's failure the first time it happens (a scrape every few seconds must not flood the log)."""
    if (plugin, hook) in _reported:
        return
    _reported.add((plugin, hook))
    log.error(f"plugin {plugin}: its {hook} hook failed; its part is skipped (logged once)",
              extra={"plugin": plugin, "hook": hook, "error": f"{type(exc).__name__}: {exc}"[:500]}, exc_info=exc)


def observe(services: Services) -> None:
    for plugin in registry().active():
        try:
            plugin.observe(services)
        except Exception as exc:  # noqa: BLE001 - a plugin's fault is its own: the others' gauges still count
            failed(plugin.name, "observe", exc)


async def before_scrape(services: Services) -> None:
    for plugin in registry().active():
        try:
            await plugin.before_scrape(services)
        except Exception as exc:  # noqa: BLE001 - the last value read stays; /metrics still answers
            failed(plugin.name, "before_scrape", exc)


async def stats(services: Services) -> dict[str, Any]:
    """Every plugin's part of /admin/stats, merged; a part that fails is left out."""
    merged: dict[str, Any] = {}
    for plugin in registry().active():
        try:
            merged.update(await plugin.stats(services))
        except Exception as exc:  # noqa: BLE001 - the other parts still answer
            failed(plugin.name, "stats", exc)
    return merged


def background(current: CurrentServices) -> list[Coroutine[Any, Any, None]]:
    """Each plugin's long-running work, each piece guarded: one that ends with an error stops alone."""
    work: list[Coroutine[Any, Any, None]] = []
    for plugin in registry().active():
        try:
            work += [_guarded(plugin, job) for job in plugin.background(current)]
        except Exception as exc:  # noqa: BLE001 - a plugin that cannot say its work has none
            failed(plugin.name, "background", exc)
    return work


async def _guarded(plugin: type[Plugin], job: Coroutine[Any, Any, None]) -> None:
    try:
        await job
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the process and the other plugins' work go on
        failed(plugin.name, "background", exc)
