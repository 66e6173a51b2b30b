"""Notices edits of the config file through the OS's file events (watchfiles), not by polling its mtime.

The file's directory is watched rather than the file: editors save by writing a new
file and renaming it over the old one, and Kubernetes swaps a ConfigMap's `..data`
symlink, and a watch on the old file would see neither. Events are only a hint: a
change is reported when the file's bytes differ from the last ones reported, so a
save that fires several events, or touches the file without changing it, reloads
once or not at all. (WATCHFILES_FORCE_POLLING=1 makes watchfiles poll where the
file system sends no events, as some network mounts do not.)
"""
from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from watchfiles import Change, awatch


def _absolute(path: str | Path) -> Path:
    # a relative path means the start directory, wherever the process is later; no I/O, only getcwd
    return Path(path).absolute()


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # mid-rename, or removed: the next event tells


def _concerns(path: Path) -> Callable[[Change, str], bool]:
    """Events of the file itself or of a ConfigMap's `..data` link; not of its neighbours (a log file or a
    database beside the config would otherwise wake the watch at every write)."""
    names = {path.name, "..data"}
    return lambda change, changed: Path(changed).name in names


async def changes(config_path: str | Path) -> AsyncIterator[str]:
    """Yield the new content digest each time the file's content changes, until cancelled."""
    path = _absolute(config_path)
    last = _digest(path)
    async for _ in awatch(path.parent, recursive=False, watch_filter=_concerns(path)):
        now = _digest(path)
        if now is not None and now != last:
            last = now
            yield now
