"""Choosing the shared rate limiter (issue 12): the gateway's Lua GCRA against the `limits` library.

For each candidate, on one private redis-server:
1. cost per check: CPU microseconds in this process per admitted check, 32 checks in flight
   (the gateway's cost on every request; the Redis round trip overlaps with other requests);
2. accuracy across two gateways: two clients with their own connection pools hit one
   limit as fast as they can for a few seconds; admitted / (burst + rate x time).

The `limits` candidates run only when the library is installed (pip install 'limits[async-redis]');
it is not a dependency of the gateway.

Run: python -m benchmarks.bench_limiter [--seconds 4]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

import redis.asyncio as aioredis

from gateway.limiter import Limiter, LocalBuckets, Quota
from tests.procs import RedisServer

Check = Callable[[], Awaitable[bool]]
QUOTA = Quota(per_sec=200.0, burst=100)
# the cost is measured on admitted checks (a refusal the gateway remembers costs no round trip)
OPEN = Quota(per_sec=1e6, burst=10**6)


async def cost_us(check: Check, n: int = 6000, in_flight: int = 32) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            await check()

    started = time.process_time()
    await asyncio.gather(*(worker(n // in_flight) for _ in range(in_flight)))
    return (time.process_time() - started) / n * 1e6


async def accuracy(checks: list[Check], seconds: float) -> float:
    admitted = 0
    deadline = time.monotonic() + seconds

    async def worker(check: Check) -> None:
        nonlocal admitted
        while time.monotonic() < deadline:
            allowed = await check()  # awaited first: `x += await f()` reads x before it waits
            admitted += allowed

    started = time.monotonic()
    await asyncio.gather(*(worker(c) for c in checks for _ in range(8)))
    return admitted / (QUOTA.burst + QUOTA.per_sec * (time.monotonic() - started))


def gcra_check(url: str, tag: str, quota: Quota) -> Check:
    limiter = Limiter(aioredis.Redis.from_url(url), "bench")

    async def check() -> bool:
        return (await limiter.hit(tag, "requests", quota, 1)).allowed

    return check


def limits_check(url: str, strategy: str, tag: str, quota: Quota) -> Check | None:
    try:
        from limits import RateLimitItemPerSecond
        from limits.aio import storage, strategies
    except ImportError:
        return None
    store = storage.RedisStorage(url.replace("redis://", "async+redis://"), implementation="redispy")
    limiter = (strategies.MovingWindowRateLimiter(store) if strategy == "moving"
               else strategies.SlidingWindowCounterRateLimiter(store))
    # `limits` has no burst apart from the rate: its nearest policies to 200/s with bursts of 100 are
    # 100 per second (a moving window of the burst) and 200 per second (a sliding window of the rate)
    amount = int(quota.burst if strategy == "moving" else quota.per_sec)
    item = RateLimitItemPerSecond(amount, 1)

    async def check() -> bool:
        return await limiter.hit(item, tag)

    return check


async def run(url: str, seconds: float) -> None:
    local = LocalBuckets()

    async def local_check() -> bool:
        return local.hit(("bench", "requests"), QUOTA).allowed

    print(f"in process GCRA (no Redis)        {await cost_us(local_check):7.1f} us/check")
    candidates: dict[str, Callable[[str, Quota], Check | None]] = {
        "Lua GCRA, redis-py (chosen)": lambda tag, quota: gcra_check(url, tag, quota),
        "limits moving window, redis-py": lambda tag, quota: limits_check(url, "moving", tag, quota),
        "limits sliding window counter": lambda tag, quota: limits_check(url, "sliding", tag, quota),
    }
    for i, (name, make) in enumerate(candidates.items()):
        first = make(f"cost{i}", OPEN)
        if first is None:
            print(f"{name:33s} skipped: pip install 'limits[async-redis]'")
            continue
        await first()  # connects and loads the script
        cost = await cost_us(first)
        pair = [make(f"acc{i}", QUOTA), make(f"acc{i}", QUOTA)]
        ratio = await accuracy([c for c in pair if c is not None], seconds)
        print(f"{name:33s} {cost:7.1f} us/check   two clients admitted {ratio:.3f} x the limit")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            asyncio.run(run(redis.url, args.seconds))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
