"""Rate limits as token buckets (GCRA), shared through Redis when configured, kept in process otherwise.

GCRA keeps one number per bucket, the theoretical arrival time (TAT): a request
is admitted when pushing the TAT one interval (1/rate) later leaves it within
`burst` intervals of now. In Redis that is one key per bucket and one short Lua
script per check, on the Redis clock, so every gateway sees one bucket
(benchmarks/bench_limiter.py measured it against the `limits` library; docs/libraries.md).

The limiter never fails a request: with Redis unreachable each process keeps
its share of every limit (rate and burst / number of gateway processes) locally,
and tries Redis again a second later. A check Redis is slow to answer while it
answers this process's others (or while this process was not running) waits for
its answer: the delay is this process's own loop, and only Redis's answer keeps
the shared limit (a local share admits what the shared bucket would refuse).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import MaxConnectionsError, RedisError

from exports_common.redis_client import AnyRedis

log = logging.getLogger("gateway.limiter")

# how long a process keeps to its local share after Redis failed, before one request tries Redis again
REDIS_RETRY_SEC = 1.0
# a check that Redis has not answered by then, nor any other check of this process meanwhile, is decided
# locally (a stalled Redis must not stall requests)
REDIS_TIMEOUT_SEC = 0.25
# a timeout that fired later than this after its time says the process stalled, not Redis
LATE_TIMER_SEC = 0.05
# the longest a check waits for its own answer while Redis is evidently alive; then it is decided locally all
# the same (redis-py's socket timeout bounds the call too: exports_common/redis_client.py)
REDIS_WAIT_MAX_SEC = 1.0
# A request is admitted when it fits within half an interval: a bucket's sums meet its depth only up to
# rounding (clocks are large numbers: seconds since boot here, milliseconds since 1970 in Redis, where the TAT
# is also stored to the microsecond), and compared exactly a full burst sent at one instant often lost its
# last request. Half an interval is far above the rounding and can never admit a whole request more.

_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then tat = math.max(tonumber(stored), now) end
local new_tat = tat + interval
if new_tat - now - tolerance > interval / 2 then
  return {0, 0, math.ceil(new_tat - tolerance - now), math.ceil(tat - now)}
end
redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now) + 1)
return {1, math.max(0, math.floor((tolerance - (new_tat - now)) / interval + 1e-9)), 0, math.ceil(new_tat - now)}
"""


@dataclass(frozen=True)
class Quota:
    """`per_sec` sustained, up to `burst` at once (a full bucket)."""

    per_sec: float
    burst: int
    # the time one request takes from the bucket, and the time an empty bucket takes to fill (its depth: the
    # policy is `burst` requests per this window)
    interval: float = field(init=False, repr=False, compare=False)
    window_sec: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", 1.0 / self.per_sec)
        object.__setattr__(self, "window_sec", self.burst / self.per_sec)

    def share(self, processes: int) -> Quota:
        return Quota(self.per_sec / processes, max(1, self.burst // processes))


@dataclass(slots=True)
class Decision:
    """What a limit says of one request."""

    allowed: bool
    remaining: int
    retry_after: float  # seconds until one more request would be admitted; 0 when this one was
    reset: float  # seconds until the bucket is full again


def fits(ahead: float, quota: Quota) -> bool:
    """Whether a request that puts the bucket's TAT `ahead` seconds after now is admitted."""
    return ahead - quota.window_sec <= 0.5 * quota.interval


def gcra(tat: float, now: float, quota: Quota) -> Decision:
    """The decision for one request at `now`. Admitted, the bucket's new TAT is `now + decision.reset`."""
    interval, tolerance = quota.interval, quota.window_sec
    tat = max(tat, now)
    ahead = tat + interval - now
    if not fits(ahead, quota):
        return Decision(False, 0, ahead - tolerance, tat - now)
    left = math.floor((tolerance - ahead) / interval + 1e-9)  # -1 for the last half interval
    return Decision(True, max(left, 0), 0.0, ahead)


# a bucket of this process: (tag, limit); meaningful only here, unlike the Redis key
LocalKey = tuple[str, str]


class LocalBuckets:
    """Buckets in this process. A full bucket is the same as none, so those are swept when the map grows."""

    def __init__(self) -> None:
        self._tat: dict[LocalKey, float] = {}
        self._sweep_at = 10_000

    def hit(self, key: LocalKey, quota: Quota) -> Decision:
        now = time.monotonic()
        decision = gcra(self._tat.get(key, now), now, quota)
        if decision.allowed:
            self._keep(key, now + decision.reset, now)
        return decision

    def _keep(self, key: LocalKey, new_tat: float, now: float) -> None:
        self._tat[key] = new_tat
        if len(self._tat) > self._sweep_at:
            self._tat = {k: tat for k, tat in self._tat.items() if tat > now}
            self._sweep_at = max(10_000, 2 * len(self._tat))

    def __len__(self) -> int:
        return len(self._tat)


class Limiter:
    def __init__(self, redis: AnyRedis | None, prefix: str) -> None:
        self.local = LocalBuckets()
        self.prefix = prefix
        self._script: Any = redis.register_script(_GCRA) if redis is not None else None
        self._redis_down_until = 0.0
        self._answered_at = 0.0  # when Redis last answered a check of this process
        self._checks: set[asyncio.Task[Decision]] = set()  # calls under way (the loop keeps only weak references)
        # bucket -> when Redis said the next request fits: until then every gateway's request would be
        # refused too (no token accrues anywhere sooner), so a flood's refusals cost no round trip
        self._refused_until: dict[str, float] = {}
        self._refused_sweep_at = 10_000

    def hit_in_process(self, tag: str, limit: str, quota: Quota) -> Decision | None:
        """`hit`, when the limits are kept in this process (no Redis): decided without an await. Else None."""
        return self.local.hit((tag, limit), quota) if self._script is None else None

    async def hit(self, tag: str, limit: str, quota: Quota, processes: int) -> Decision:
        """One request against bucket `limit` of `tag` (a tenant or a client address).

        `tag` is the Redis Cluster hash tag: one key per tag and limit, all of a tag's in one slot.
        """
        if self._script is None:
            return self.local.hit((tag, limit), quota)
        key = f"{self.prefix}:rl:{{{tag}}}:{limit}"
        refused_until = self._refused_until.get(key)
        if refused_until is not None:
            wait = refused_until - time.monotonic()
            if wait > 0:
                return Decision(False, 0, wait, quota.window_sec)
            del self._refused_until[key]
        if self._redis_down_until:
            now = time.monotonic()
            if now < self._redis_down_until:
                return self.local.hit((tag, limit), quota.share(processes))
            # this request tries Redis again; the others keep to the local share meanwhile
            self._redis_down_until = now + REDIS_RETRY_SEC
        # the call runs as a task of its own: a check that waits no longer (Redis down, or the request gone)
        # leaves it to finish, so what Redis counted is what this process learns, and no connection is torn down
        check = asyncio.ensure_future(self._ask(key, quota))
        self._checks.add(check)
        check.add_done_callback(self._checked)
        asked = waiting_since = time.monotonic()
        while not (await asyncio.wait((check,), timeout=REDIS_TIMEOUT_SEC))[0]:
            now = time.monotonic()
            alive = self._answered_at > waiting_since or now - waiting_since > REDIS_TIMEOUT_SEC + LATE_TIMER_SEC
            if alive and now - asked <= REDIS_WAIT_MAX_SEC:
                waiting_since = now
                continue
            if not alive:
                return self._redis_failed(TimeoutError(f"no answer within {REDIS_TIMEOUT_SEC} s"), tag, limit,
                                          quota, processes)
            # Redis answers this process's other checks, or the timer ran late: this process is what is slow
            # (busy, or not running on a loaded machine), not Redis. This request is decided locally; the next
            # ones ask Redis again, since a second kept to the local share would hold the process to
            # 1 / gateway_processes of the limit
            return self.local.hit((tag, limit), quota.share(processes))
        try:
            return check.result()
        except MaxConnectionsError:
            # every connection of the client's pool is in use (exports_common/redis_client.py): no news of Redis
            return self.local.hit((tag, limit), quota.share(processes))
        except (RedisError, OSError) as exc:
            return self._redis_failed(exc, tag, limit, quota, processes)

    async def _ask(self, key: str, quota: Quota) -> Decision:
        """Redis's decision; a late one (the request decided locally, or gone) still teaches this process that
        Redis is up, and what it refuses."""
        allowed, remaining, retry_ms, reset_ms = await self._script(
            keys=[key], args=[1000.0 * quota.interval, 1000.0 * quota.window_sec])
        self._answered_at = time.monotonic()
        if self._redis_down_until:
            log.info("rate limits: Redis is back; limits are shared again")
            self._redis_down_until = 0.0
        decision = Decision(bool(allowed), int(remaining), int(retry_ms) / 1000.0, int(reset_ms) / 1000.0)
        if not decision.allowed:
            self._remember_refusal(key, decision.retry_after)
        return decision

    def _checked(self, check: asyncio.Task[Decision]) -> None:
        self._checks.discard(check)
        if not check.cancelled():
            check.exception()  # a failure nobody waited for is the Redis outage already logged, not a bug

    def _redis_failed(self, exc: Exception, tag: str, limit: str, quota: Quota, processes: int) -> Decision:
        """The local share decides, this request and every other for a second."""
        if not self._redis_down_until:
            log.warning("rate limits: Redis unreachable; each gateway process enforces its share locally "
                        "until it is back", extra={"error": repr(exc), "processes": processes})
        self._redis_down_until = time.monotonic() + REDIS_RETRY_SEC
        return self.local.hit((tag, limit), quota.share(processes))

    def _remember_refusal(self, key: str, retry_after: float) -> None:
        now = time.monotonic()
        if len(self._refused_until) > self._refused_sweep_at:
            self._refused_until = {k: t for k, t in self._refused_until.items() if t > now}
            self._refused_sweep_at = max(10_000, 2 * len(self._refused_until))
        self._refused_until[key] = now + retry_after
