"""The rate limiter's two tiers against the `limits` library: the shared one (issue 12) and the in-process one.

The shared tier, the gateway's Lua GCRA, for each candidate on one private redis-server:
1. cost per check: CPU microseconds in this process per admitted check, 32 checks in flight
   (the gateway's cost on every request; the Redis round trip overlaps with other requests);
2. accuracy across two gateways: two clients with their own connection pools hit one
   limit as fast as they can for a few seconds; admitted / (burst + rate x time).

The in-process tier (`--in-process`: the limits when no Redis is configured, and each process's
share while Redis is unreachable), against `limits`' MemoryStorage with each strategy (moving
window, sliding-window counter, fixed window) in `LocalBuckets`' place:
1. instructions per check (callgrind): admitted, refused, and 100,000 tenants one check each;
2. accuracy: one tenant sending as fast as one loop can, admitted / (burst + rate x time);
3. bytes held per tenant (tracemalloc), and once every window has passed;
4. the product figure: instructions per cache hit of the whole gateway process with no Redis
   (benchmarks/server_instructions.py's count), its own buckets against each strategy's
   (`python -m benchmarks.bench_limiter run --config FILE` serves the gateway so).

`limits` comes with the `.[bench]` extra (it is not a dependency of the gateway); without it the
shared tier's `limits` candidates are skipped, and `--in-process` stops at its import.

Run: python -m benchmarks.bench_limiter [--seconds 4] [--in-process [--requests 300] [--connections 8]]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

import redis.asyncio as aioredis

from benchmarks import callgrind
from gateway.limiter import Decision, Limiter, LocalBuckets, Quota
from tests.procs import RedisServer, free_port

Check = Callable[[], Awaitable[bool]]
STRATEGY_ENV = "BENCH_LIMITER_STRATEGY"  # the strategy `run` serves the gateway with


class Buckets(Protocol):
    def hit(self, key: tuple[str, str], quota: Quota) -> Decision: ...
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
            print(f"{name:33s} skipped: pip install -e '.[bench]'")
            continue
        await first()  # connects and loads the script
        cost = await cost_us(first)
        pair = [make(f"acc{i}", QUOTA), make(f"acc{i}", QUOTA)]
        ratio = await accuracy([c for c in pair if c is not None], seconds)
        print(f"{name:33s} {cost:7.1f} us/check   two clients admitted {ratio:.3f} x the limit")


# ---- the in-process tier (no Redis configured, or Redis unreachable) against `limits`' MemoryStorage ----

STRATEGIES = ("moving", "sliding", "fixed")
# the gateway's default requests limit: 200 per 2 s, a window of whole seconds that `limits` expresses exactly
TENANT_QUOTA = Quota(per_sec=100.0, burst=200)
REFUSING = Quota(per_sec=0.001, burst=1)  # the first check admitted, every later one refused
MANY = 100_000  # distinct tenants (or client addresses: the per-address limit's buckets)


class LibraryBuckets:
    """`LocalBuckets`' interface on `limits`' MemoryStorage: the library in the in-process tier's place.

    A quota is `burst` requests per its depth (`burst / per_sec`, in whole seconds: the library's windows
    are). An admitted request's Decision carries no numbers (the requests limit reads none: the library's
    least work); a refusal's wait comes from the window's stats, as a 429's Retry-After needs.
    """

    def __init__(self, strategy: str) -> None:
        from limits import RateLimitItemPerSecond, strategies
        from limits.storage import MemoryStorage

        kinds: dict[str, Any] = {"moving": strategies.MovingWindowRateLimiter,
                                 "sliding": strategies.SlidingWindowCounterRateLimiter,
                                 "fixed": strategies.FixedWindowRateLimiter}
        self._limiter = kinds[strategy](MemoryStorage())
        self._items: dict[Quota, Any] = {}
        self._item_kind = RateLimitItemPerSecond

    def hit(self, key: tuple[str, str], quota: Quota) -> Decision:
        item = self._items.get(quota)
        if item is None:
            item = self._items[quota] = self._item_kind(quota.burst, max(1, round(quota.window_sec)))
        if self._limiter.hit(item, *key):
            return Decision(True, 0, 0.0, quota.window_sec)
        wait = max(0.0, self._limiter.get_window_stats(item, *key).reset_time - time.time())
        return Decision(False, 0, wait, wait)


def in_process(candidate: str) -> Buckets:
    return LocalBuckets() if candidate == "gcra" else LibraryBuckets(candidate)


def workload_checks(candidate: str, workload: str) -> Callable[[int], None]:
    """A fresh candidate, warmed: a call makes N checks of the workload (`many`: each to the next tenant)."""
    buckets = in_process(candidate)
    quota = {"admitted": OPEN, "refused": REFUSING, "many": TENANT_QUOTA}[workload]
    keys = [(f"tenant-{i}", "requests") for i in range(MANY if workload == "many" else 1)]
    for key in keys[:10]:
        buckets.hit(key, quota)

    def checks(count: int) -> None:
        for i in range(count):
            buckets.hit(keys[i % len(keys)], quota)

    return checks


def child(candidate: str, workload: str, count: int) -> None:
    """`count` checks of one workload, for callgrind (benchmarks/callgrind.py's per_operation)."""
    workload_checks(candidate, workload)(count)


def cpu_ns_per_check(candidates: list[str], workload: str, count: int, rounds: int = 3) -> dict[str, float]:
    """CPU time of this process per check (the library's expiry timer thread included, at the machine's own
    pace), each candidate a fresh one per round, in turns; the median of the rounds."""
    spent: dict[str, list[float]] = {c: [] for c in candidates}
    for _ in range(rounds):
        for candidate in candidates:
            checks = workload_checks(candidate, workload)
            started = time.process_time()
            checks(count)
            spent[candidate].append((time.process_time() - started) / count * 1e9)
    return {c: sorted(ns)[len(ns) // 2] for c, ns in spent.items()}


def admitted_fraction(buckets: Buckets, seconds: float) -> float:
    """One tenant sending as fast as one loop can for `seconds`: admitted / (burst + rate x time)."""
    admitted = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        admitted += buckets.hit(("tenant", "requests"), TENANT_QUOTA).allowed
    return admitted / (TENANT_QUOTA.burst + TENANT_QUOTA.per_sec * (time.monotonic() - started))


def edge_burst(buckets: Buckets) -> int:
    """Admitted within 0.2 s: one check, then quiet until 0.1 s before a window of the library's (whole seconds)
    from it would turn, then as fast as one loop can. A bucket holds `burst` (and refills 0.2 x rate meanwhile)."""
    window = max(1, round(TENANT_QUOTA.window_sec))
    buckets.hit(("tenant", "requests"), TENANT_QUOTA)
    time.sleep(window - 0.1)
    admitted = 0
    started = time.monotonic()
    while time.monotonic() - started < 0.2:
        admitted += buckets.hit(("tenant", "requests"), TENANT_QUOTA).allowed
    return admitted


def held_bytes(buckets: Buckets, tenants: int, checks: int) -> tuple[float, float]:
    """Bytes held per tenant after `tenants` distinct tenants sent `checks` each, and again once their
    windows have passed and another tenant's check came (what a forgotten tenant still costs)."""
    tracemalloc.start()
    for i in range(tenants):
        key = (f"tenant-{i}", "requests")
        for _ in range(checks):
            buckets.hit(key, TENANT_QUOTA)
    full = tracemalloc.get_traced_memory()[0] / tenants
    time.sleep(TENANT_QUOTA.window_sec + 1.1)  # every window over
    buckets.hit(("one-more", "requests"), TENANT_QUOTA)
    time.sleep(1.0)  # the library's expiry timer, started by that check 10 ms later, has swept
    later = tracemalloc.get_traced_memory()[0] / tenants
    tracemalloc.stop()
    return full, later


def gateway_hit_instructions(requests: int, connections: int) -> dict[str, float]:
    """Whole gateway process, instructions per cache hit (no Redis), with its own buckets and each strategy's."""
    from benchmarks.harness import AUTH, processes, submit_and_wait
    from benchmarks.server_instructions import long_ttl, per_request
    from tests.conftest import backend_config, gateway_config

    counted = {}
    with processes() as procs, tempfile.TemporaryDirectory(prefix="bench-limiter-") as tmp:
        backend = procs.start("backend_stub", backend_config(procs.workdir), "backend")
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url), "gateway")
        path = f"/api/v1/exports/{submit_and_wait(gateway.url, {'export_type': 'report_export'}, {'COMPLETED'})}"
        gateway.stop()
        measured = long_ttl(gateway_config(procs.workdir, backend.url, log_level="warning"))
        for candidate in ("gcra", *STRATEGIES):
            os.environ[STRATEGY_ENV] = candidate
            module = "gateway" if candidate == "gcra" else "benchmarks.bench_limiter"
            counted[candidate] = per_request(module, measured, path, AUTH, requests, connections, Path(tmp))
    return counted


def gateway_hit_cpu(seconds: float, rounds: int) -> dict[str, float]:
    """Whole gateway process, CPU µs per cache hit (no Redis), wall clock: wrk against its own buckets and
    each strategy's in turns (a load that comes and goes falls on each alike), each server pinned to one core
    and wrk on the other; the best round of each. At the machine's own pace, unlike callgrind's, the
    library's expiry timer starts its thread as often as it would in service."""
    from benchmarks import wrk
    from benchmarks.harness import AUTH, LOAD_CPU, cpu_per_request, pin, processes, submit_and_wait
    from tests.conftest import RAISED_LIMITS, backend_config, gateway_config

    best: dict[str, float] = {}
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir), "backend")
        config = gateway_config(procs.workdir, backend.url, log_level="warning")
        servers = {"gcra": procs.start("gateway", config, "gateway")}
        task_id = submit_and_wait(servers["gcra"].url, {"export_type": "report_export"}, {"COMPLETED"})
        path = f"/api/v1/exports/{task_id}"
        for strategy in STRATEGIES:
            servers[strategy] = procs.start("benchmarks.bench_limiter", config | {"port": free_port()}, strategy,
                                            env=RAISED_LIMITS | {STRATEGY_ENV: strategy})
        for server in servers.values():
            pin(server)
            wrk.run(f"{server.url}{path}", seconds=1, headers=AUTH, cpu=LOAD_CPU)  # warm-up: the cache filled
        for _ in range(rounds):
            for name, server in servers.items():
                assert server.proc is not None
                micros, result = cpu_per_request(server.proc.pid, f"{server.url}{path}", seconds, AUTH, cpu=LOAD_CPU)
                assert result.requests > 0 and not result.errors, (name, result.line())
                best[name] = min(micros, best.get(name, micros))
    return best


def serve_with_library(strategy: str) -> None:
    """The gateway, its in-process buckets on `limits` (`run --config FILE`, as the gateway's own command)."""
    import gateway.limiter
    from gateway.__main__ import cli

    # the Limiter makes its buckets by this module name at the gateway's start
    setattr(gateway.limiter, "LocalBuckets", lambda: LibraryBuckets(strategy))  # noqa: B010 (a class, swapped)
    sys.exit(cli())


def report_in_process(seconds: float, requests: int, connections: int, rounds: int) -> None:
    names = {"gcra": "in-process GCRA (ours)", "moving": "limits moving window", "sliding": "limits sliding counter",
             "fixed": "limits fixed window"}
    print("instructions per check (callgrind: N and 0 checks, the difference over N)")
    for workload, count in (("admitted", 20_000), ("refused", 20_000), ("many", MANY)):
        for candidate, name in names.items():
            cost = callgrind.per_operation("benchmarks.bench_limiter", [candidate, workload], count)
            print(f"  {workload:9s} {name:26s} {cost:9,.0f}")
    print("CPU ns per check, this process at its own pace (the expiry timer's threads included), in turns, "
          "median of 3 rounds")
    for workload, count in (("admitted", 200_000), ("refused", 200_000), ("many", 2 * MANY)):
        for candidate, ns in cpu_ns_per_check(list(names), workload, count).items():
            print(f"  {workload:9s} {names[candidate]:26s} {ns:9,.0f}")
    print(f"admitted under a steady over-limit load, {seconds:g} s, {TENANT_QUOTA.per_sec:g}/s bursts of "
          f"{TENANT_QUOTA.burst}, as a fraction of burst + rate x time")
    for candidate, name in names.items():
        print(f"  {name:26s} {admitted_fraction(in_process(candidate), seconds):.3f}")
    print(f"admitted within 0.2 s around the turn of a window (a bucket holds {TENANT_QUOTA.burst})")
    for candidate, name in names.items():
        print(f"  {name:26s} {edge_burst(in_process(candidate)):5d}")
    print("bytes held per tenant (tracemalloc): after its checks / once its window passed")
    for tenants, checks in ((MANY, 1), (1_000, TENANT_QUOTA.burst)):
        for candidate, name in names.items():
            full, later = held_bytes(in_process(candidate), tenants, checks)
            print(f"  {tenants:,} tenants x {checks:3d} checks  {name:26s} {full:9,.0f} / {later:9,.0f}")
    print("whole gateway, no Redis, instructions per cache hit (callgrind)")
    counted = gateway_hit_instructions(requests, connections)
    for candidate, ours in counted.items():
        print(f"  {names[candidate]:26s} {ours:9,.0f}   / ours {ours / counted['gcra']:.3f}")
    print(f"whole gateway, no Redis, CPU µs per cache hit (wall clock, in turns, best of {rounds} rounds of "
          f"{seconds:g} s)")
    cpu = gateway_hit_cpu(seconds, rounds)
    for candidate, micros in cpu.items():
        print(f"  {names[candidate]:26s} {micros:9.1f}   / ours {micros / cpu['gcra']:.3f}")


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        serve_with_library(os.environ[STRATEGY_ENV])
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--in-process", action="store_true", help="the in-process tier against limits' memory storage")
    parser.add_argument("--requests", type=int, default=300, help="--in-process: cache hits counted (N and 5N)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="--in-process: wall-clock rounds a server")
    args = parser.parse_args()
    if args.in_process:
        report_in_process(args.seconds, args.requests, args.connections, args.rounds)
        return
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            asyncio.run(run(redis.url, args.seconds))
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
