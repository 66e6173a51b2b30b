"""The per-tenant cap on open event streams (`max_open_streams`), shared by every gateway through Redis.

With Redis, a tenant's open streams are one sorted set (`<prefix>:streams:{<tenant>}`):
a member per stream, scored by when its lease ends on Redis's clock. Opening one is a
script that drops the ended leases, counts the rest and adds one under the cap; every
gateway renews its own streams' leases (`renew_forever`) and removes a stream when it
ends, so a gateway that dies mid-stream holds its share only until its leases run out.
Without Redis the count is this process's; with Redis unreachable each process holds to
its share (cap / gateway_processes) locally, like the rate limits, and never answers 5xx
because of the cap.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Any

from redis.exceptions import RedisError

from exports_common.errors import ApiError, ErrorKind
from exports_common.redis_client import AnyRedis

log = logging.getLogger("gateway.events")

LEASE_SEC = 60.0
REDIS_RETRY_SEC = 1.0
REDIS_TIMEOUT_SEC = 0.5
# how long a refused client waits before it tries to open another stream
RETRY_AFTER_SEC = 5

# KEYS: the tenant's set; ARGV: lease ms, cap, member. Returns the count with this stream, or -count when refused.
_OPEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then return -n end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return n + 1
"""
# KEYS: the tenant's set; ARGV: lease ms, members. Extends the leases of those still in it.
_RENEW = """
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 0
"""


def refusal(tenant: str, cap: int, open_now: int) -> ApiError:
    """429 with Retry-After and the RateLimit headers, as every limit answers."""
    return ApiError(ErrorKind.TOO_MANY_STREAMS,
                    f"tenant {tenant} has {open_now} event streams open, its limit of {cap}; close some or retry "
                    f"after {RETRY_AFTER_SEC} s",
                    data={"open": open_now, "limit": cap, "retry_after_sec": RETRY_AFTER_SEC},
                    headers={"Retry-After": str(RETRY_AFTER_SEC), "RateLimit-Policy": f'"streams";q={cap}',
                             "RateLimit": f'"streams";r=0;t={RETRY_AFTER_SEC}'})


class StreamCap:
    def __init__(self, redis: AnyRedis | None, prefix: str) -> None:
        self.prefix = prefix
        self.redis = redis
        self._open: Any = redis.register_script(_OPEN) if redis is not None else None
        self._renew: Any = redis.register_script(_RENEW) if redis is not None else None
        self._ids = itertools.count()
        self._me = f"{os.getpid()}-{time.time_ns():x}"
        # every stream this process holds, by tenant: counted here without Redis, renewed there with it
        self.held: dict[str, set[str]] = {}
        self._local_only: set[str] = set()  # streams admitted while Redis was unreachable: not in its set
        self._redis_down_until = 0.0

    def _key(self, tenant: str) -> str:
        return f"{self.prefix}:streams:{{{tenant}}}"

    def open_count(self, tenant: str) -> int:
        return len(self.held.get(tenant, ()))

    async def acquire(self, tenant: str, cap: int, processes: int) -> str:
        """A stream's place under the tenant's cap (release it when the stream ends); raises the 429 over it."""
        member = f"{self._me}-{next(self._ids)}"
        if self._open is not None and time.monotonic() >= self._redis_down_until:
            try:
                async with asyncio.timeout(REDIS_TIMEOUT_SEC):
                    count = int(await self._open(keys=[self._key(tenant)], args=[int(LEASE_SEC * 1000), cap, member]))
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning("stream cap: Redis unreachable; this process holds its share of each tenant's cap "
                            "locally until it is back", extra={"error": repr(exc)})
                self._redis_down_until = time.monotonic() + REDIS_RETRY_SEC
            else:
                if count < 0:
                    raise refusal(tenant, cap, -count)
                self.held.setdefault(tenant, set()).add(member)
                return member
        local_cap = cap if self._open is None else max(1, cap // processes)
        if self.open_count(tenant) >= local_cap:
            raise refusal(tenant, local_cap, self.open_count(tenant))
        self.held.setdefault(tenant, set()).add(member)
        if self._open is not None:
            self._local_only.add(member)
        return member

    async def release(self, tenant: str, member: str) -> None:
        members = self.held.get(tenant)
        if members is not None:
            members.discard(member)
            if not members:
                del self.held[tenant]
        if self.redis is None or member in self._local_only:
            self._local_only.discard(member)
            return
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_SEC):
                await self.redis.zrem(self._key(tenant), member)
        except (RedisError, OSError, TimeoutError):
            pass  # its lease runs out by itself

    async def renew_forever(self) -> None:
        """Extend this process's leases well before they end, for as long as the process runs."""
        if self._renew is None:
            return
        while True:
            await asyncio.sleep(LEASE_SEC / 3)
            for tenant, members in list(self.held.items()):
                shared = [m for m in members if m not in self._local_only]
                if not shared:
                    continue
                try:
                    async with asyncio.timeout(REDIS_TIMEOUT_SEC * 4):
                        await self._renew(keys=[self._key(tenant)], args=[int(LEASE_SEC * 1000), *shared])
                except (RedisError, OSError, TimeoutError) as exc:
                    log.warning("stream cap: could not renew leases in Redis", extra={"error": repr(exc)})

