"""The queue's claim cost: fair turns against the one FIFO they replaced, same run, both stores.

Queues N tasks (over 1 tenant, and over 50 tenants), then claims and acks them all, one at a
time, and prints the cost per claim + ack. `--ref DIR` runs the same measurement on another
source tree (e.g. `git archive <commit> | tar -x -C DIR`, the FIFO before fair scheduling) in a
subprocess against the same Redis, and prints the ratio.

Run: python -m benchmarks.bench_claim [--tasks 2000] [--ref DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from backend_stub.models import Task
from backend_stub.store.redis_store import RedisTaskStore
from backend_stub.store.sqlite_store import SqliteTaskStore

CASES = [("sqlite", 1), ("sqlite", 50), ("redis", 1), ("redis", 50)]


def _task(n: int, tenant: str) -> Task:
    now = time.time()
    return Task(task_id=f"exp-20260101-{n:016x}", tenant=tenant, export_type="e", filters={}, format="csv",
                timeout_sec=60, callback_url=None, fingerprint="f", created_at=now, updated_at=now)


async def _measure(kind: str, tenants: int, tasks: int, redis_url: str) -> float:
    """Microseconds per claim + ack, over `tasks` queued round the tenants."""
    with tempfile.TemporaryDirectory() as tmp:
        store = (RedisTaskStore(redis_url, f"bench{time.time_ns()}") if kind == "redis" else SqliteTaskStore(tmp))
        await store.open()
        for n in range(tasks):
            await store.create(_task(n, f"tenant{n % tenants}"))
        start = time.perf_counter()
        for _ in range(tasks):
            lease = await store.claim("bench", 30, 0.0)
            assert lease is not None
            await store.ack(lease)
        took = time.perf_counter() - start
        await store.close()
    return took / tasks * 1e6


def measure_all(tasks: int, redis_url: str) -> dict[str, float]:
    return {f"{kind}/{tenants}": asyncio.run(_measure(kind, tenants, tasks, redis_url)) for kind, tenants in CASES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--ref", help="a source tree to compare with (the FIFO)")
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)  # the subprocess's: measure only
    args = parser.parse_args()
    if args.redis_url:
        print(json.dumps(measure_all(args.tasks, args.redis_url)))
        return
    from tests.procs import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            rounds = []
            for _ in range(2):  # alternate the trees, keep each one's best
                now = measure_all(args.tasks, redis.url)
                ref = _run_ref(args.ref, args.tasks, redis.url) if args.ref else None
                rounds.append((now, ref))
        finally:
            redis.stop()
    best_now = {k: min(r[0][k] for r in rounds) for k in rounds[0][0]}
    print(f"claim + ack, us per task ({args.tasks} tasks queued, then drained one at a time; best of 2)")
    for case, cost in best_now.items():
        line = f"{case:10} fair {cost:7.1f}"
        if args.ref:
            ref_cost = min(r[1][case] for r in rounds if r[1] is not None)
            line += f"   FIFO {ref_cost:7.1f}   fair / FIFO {cost / ref_cost:.2f}"
        print(line)


def _run_ref(tree: str, tasks: int, redis_url: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--tasks", str(tasks), "--redis-url", redis_url],
                         env=os.environ | {"PYTHONPATH": tree}, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
