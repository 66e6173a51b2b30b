"""Notices edits of a config file through the OS's file events (watchfiles), not by polling its mtime.

The file's directory is watched rather than the file: editors save by writing a new
file and renaming it over the old one, and Kubernetes swaps a ConfigMap's `..data`
symlink, and a watch on the old file would see neither. Only events on the file's own
name and on Kubernetes' `..data` names count: anything else in that directory (a log
file written there, an editor's swap file) is none of the watcher's business, and the
watcher library's own "changes detected" lines are kept out of the log, so a log file
beside the config cannot feed the watcher. Events are only a hint: a change is reported
when the file's bytes differ from the last ones reported, so a save that fires several
events, or touches the file without changing it, reloads once or not at all.
(WATCHFILES_FORCE_POLLING=1 makes watchfiles poll where the file system sends no
events, as some network mounts do not.)
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from watchfiles import Change, awatch

# Kubernetes mounts a ConfigMap's files as symlinks into `..data`, itself a symlink it swaps atomically
KUBERNETES_NAMES = ("..data", "..data_tmp")


def _absolute(path: str | Path) -> Path:
    # a relative path means the start directory, wherever the process is later; no I/O, only getcwd
    return Path(path).absolute()


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # mid-rename, or removed: the next event tells


def own_events(path: Path) -> Callable[[Change, str], bool]:
    """The watch filter: an event on the config file's own name, or on the names Kubernetes swaps."""
    names = {path.name, *KUBERNETES_NAMES}

    def keep(change: Change, changed: str) -> bool:
        return Path(changed).name in names
    return keep


async def changes(config_path: str | Path) -> AsyncIterator[str]:
    """Yield the new content digest each time the file's content changes, until cancelled."""
    path = _absolute(config_path)
    # its INFO line per batch of events would be written to a log that may sit in this very directory
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    last = await asyncio.to_thread(_digest, path)
    async for _ in awatch(path.parent, recursive=False, watch_filter=own_events(path)):
        now = await asyncio.to_thread(_digest, path)
        if now is not None and now != last:
            last = now
            yield now
