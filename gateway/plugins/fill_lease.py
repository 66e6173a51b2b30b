"""A fill lease: of the gateway processes sharing a cache, one calls the upstream for a missing entry.

The process that sets the lease key (SET NX PX) fills the entry; the others read the
entry every few milliseconds until it is there. The lease expires after `wait_sec`, and
no process waits longer than that: a holder killed or slow beyond it costs the others
one bounded wait and an upstream call each, never a hang. A store that fails when the
lease is asked for (Redis down) is no reason to wait: the process fills the entry
itself, as with no lease.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.exceptions import RedisError

from gateway.kv import KeyValue

log = logging.getLogger("gateway.status_cache")

POLL_SEC = 0.02  # between two reads of an entry another process fills
SUFFIX = ":fill"  # after the entry's key, so that both share its hash tag (one Cluster slot)
HELD = b"1"


class FillLease:
    def __init__(self, store: KeyValue, wait_sec: float) -> None:
        self.store = store
        self.wait_sec = wait_sec

    async def acquire(self, key: str) -> bytes | None:
        """The entry another process filled, or None when this process is to fill `key`: it holds the lease
        (given back by `release`), the store failed when asked for it, or `wait_sec` passed."""
        try:
            if await self.store.add(key + SUFFIX, HELD, self.wait_sec):
                return await self._filled_meanwhile(key)
        except RedisError as exc:
            log.warning("fill lease not taken: the shared cache failed; calling the upstream",
                        extra={"error": str(exc)})
            return None
        deadline = time.monotonic() + self.wait_sec
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_SEC)
            with contextlib.suppress(RedisError):  # a busy pool or a blip: read again within the wait
                raw = await self.store.get(key)
                if raw is not None:
                    return raw
                if await self.store.add(key + SUFFIX, HELD, self.wait_sec):  # its holder died or failed
                    return await self._filled_meanwhile(key)
        log.warning("no fill by another process within fill_wait_sec; calling the upstream",
                    extra={"fill_wait_sec": self.wait_sec})
        return None

    async def _filled_meanwhile(self, key: str) -> bytes | None:
        """With the lease just taken: the entry a fill wrote after this process's last read, if one did
        (the lease is then given back); else None, and this process fills."""
        raw = await self.store.get(key)
        if raw is not None:
            await self.release(key)
        return raw

    async def release(self, key: str) -> None:
        """The lease given back after a fill, whoever held it: the entry is there for everyone, or the fill
        failed and a waiting process may try at once (a lease not given back expires after `wait_sec`)."""
        with contextlib.suppress(RedisError):
            await self.store.delete(key + SUFFIX)
