"""Resilience benchmarks (issue 4).

1. Retry amplification: backend requests / client requests, backend failing 100% (breaker kept closed
   to measure the retries alone; goal <= 1.2) and after the breaker opened (goal near 0), and failing
   10% (goal <= 1.15 with client-visible errors under 1%). Load: 32 concurrent clients (Python, httpx:
   a ratio of counts, not a rate, so the generator's speed does not matter).
2. Fail-fast: p99 of an answer while the breaker is open vs the cache-hit poll (wrk; goal: no slower).
3. Polling storm: 200 concurrent pollers on 50 finished tasks for 20 s (wrk); backend status calls per
   task per 5 s TTL window (goal <= 1.0).

Run: python -m benchmarks.bench_resilience
"""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx

from benchmarks import wrk
from benchmarks.harness import AUTH, Processes, processes, submit_and_wait
from tests.conftest import backend_config, gateway_config
from tests.helpers import backend_requests
from tests.test_resilience import tuned

API = "/api/v1/exports"


async def offered_load(url: str, n: int, concurrency: int = 32) -> list[int]:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> int:
            async with sem:
                return (await client.get(f"{url}{API}", params={"limit": 1})).status_code
        return await asyncio.gather(*(one() for _ in range(n)))


def stack(procs: Processes, error_rate: float, breaker: dict[str, Any], name: str) -> tuple[str, str]:
    workdir = procs.workdir / name
    backend = procs.start("backend_stub", backend_config(workdir, http_fault={"error_rate": error_rate},
                                                         log_level="warning"), f"{name}-backend")
    config = tuned(gateway_config(workdir, backend.url, log_level="error"), circuit_breaker=breaker)
    gateway = procs.start("gateway", config, f"{name}-gateway")
    return backend.url, gateway.url


def amplification(procs: Processes, error_rate: float, breaker: dict[str, Any], name: str, n: int,
                  warmup: int = 0) -> tuple[float, float]:
    backend, gateway = stack(procs, error_rate, breaker, name)
    if warmup:
        asyncio.run(offered_load(gateway, warmup))
    before = backend_requests(backend)
    statuses = asyncio.run(offered_load(gateway, n))
    sent = backend_requests(backend) - before
    errors = sum(1 for s in statuses if s != 200)
    return sent / n, errors / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    n = args.requests
    never_opens = {"fail_max": 10**9, "reset_timeout_sec": 600}
    opens = {"fail_max": 5, "reset_timeout_sec": 600}
    with processes() as procs:
        ratio, errors = amplification(procs, 1.0, never_opens, "fail100", n)
        print(f"backend failing 100%, breaker closed: backend/client requests {ratio:.3f} (goal <= 1.2)")
        ratio, errors = amplification(procs, 1.0, opens, "fail100open", n, warmup=50)
        print(f"backend failing 100%, breaker open:   backend/client requests {ratio:.3f} (goal ~0)")
        ratio, errors = amplification(procs, 0.1, {"fail_max": 5, "reset_timeout_sec": 2}, "fail10", n)
        print(f"backend failing 10%:                  backend/client requests {ratio:.3f} (goal <= 1.15), "
              f"client-visible errors {errors:.2%} (goal < 1%)")

    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning"), "backend")
        config = tuned(gateway_config(procs.workdir, backend.url, log_level="error"), circuit_breaker=opens)
        gateway = procs.start("gateway", config, "gateway")
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        hit = wrk.run(f"{gateway.url}{API}/{done}", seconds=8, headers=AUTH)
        ids = [submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"}) for _ in range(50)]
        before = backend_requests(backend.url)
        lua = "ids = {" + ",".join(f'"{i}"' for i in ids) + "}\n" + \
              'request = function() return wrk.format("GET", "/api/v1/exports/" .. ids[math.random(1, #ids)]) end\n'
        storm = wrk.run(gateway.url, seconds=args.seconds, connections=200, headers=AUTH, lua=lua)
        calls = backend_requests(backend.url) - before
        windows = args.seconds / 5
        print(f"polling storm, 200 pollers, 50 tasks, {args.seconds:.0f} s: {storm.line()}")
        print(f"  backend status calls {calls}: {calls / 50 / windows:.2f} per task per 5 s window (goal <= 1.0)")
        backend.kill()
        for _ in range(50):  # bounded: five failures open the breaker
            if httpx.get(f"{gateway.url}{API}", headers=AUTH, timeout=30).status_code == 503:
                break
        fail_fast = wrk.run(f"{gateway.url}{API}?limit=1", seconds=8, headers=AUTH)
        print(f"cache-hit poll              {hit.line()}")
        print(f"breaker open (fail fast)    {fail_fast.line()}")
        print(f"  p99 fail-fast / cache hit: {fail_fast.p99_ms / hit.p99_ms:.2f} (goal <= 1.0)")


if __name__ == "__main__":
    main()
