"""Whether this backend has room to run another export: free space under its data directory.

Exports spool to data_dir before they are stored, so a backend short of space there should
take no new work: its tasks are better run by a backend with room. Two rules say it is short:
- less than `min_free_bytes` is free;
- a write failed for lack of space (the disk filled while an export ran), and since then less
  than `min_free_bytes` more has come free than there was right after that failure (with its
  partial file removed): the export that failed would fail again, so the space must really be back.
A write that fails for lack of space is `OutOfSpace`, whose message says so in plain words.
"""
from __future__ import annotations

import errno
import logging
import os
import threading

from backend_stub import metrics

log = logging.getLogger("backend.disk")
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class OutOfSpace(Exception):
    """A write found no room on the disk (or quota) under data_dir."""


def no_space(exc: OSError) -> bool:
    return exc.errno in NO_SPACE


def mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


class DiskSpace:
    def __init__(self, path: str, min_free_bytes: int) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self._lock = threading.Lock()
        self._after_failure: int | None = None  # free bytes right after the last failed write, until space is back
        self._short_reason: str | None = None  # what was last logged, so each change is logged once

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def write_failed(self) -> None:
        """A write ran out of space; call after its partial file is removed."""
        with self._lock:
            self._after_failure = self.free_bytes()

    def shortage(self) -> str | None:
        """Why this backend must not take new work now, or None when it has room."""
        free = self.free_bytes()
        with self._lock:
            if self._after_failure is not None and free >= self._after_failure + self.min_free_bytes:
                self._after_failure = None
            if free < self.min_free_bytes:
                reason: str | None = (f"{mib(free)} free under data_dir {self.path}, below min_free_bytes "
                                      f"({mib(self.min_free_bytes)})")
            elif self._after_failure is not None:
                reason = (f"an export ran out of space under data_dir {self.path}; {mib(free)} free, waiting for "
                          f"{mib(self._after_failure + self.min_free_bytes)}")
            else:
                reason = None
            changed, self._short_reason = (reason is None) != (self._short_reason is None), reason
        metrics.disk_free.set(free)
        metrics.disk_short.set(0 if reason is None else 1)
        if changed:
            if reason is None:
                log.warning("disk space is back: claiming tasks again", extra={"free_bytes": free})
            else:
                log.warning("short of disk space: no new task is claimed until space is back",
                            extra={"reason": reason, "free_bytes": free})
        return reason
