"""Resilience benchmarks (issue 4).

1. Retry amplification: backend requests / client requests, backend failing 100% (breaker kept closed
   to measure the retries alone; goal <= 1.2) and after the breaker opened (goal near 0), and failing
   10% (goal <= 1.15 with client-visible errors under 1%). Load: 32 concurrent clients (Python, httpx:
   a ratio of counts, not a rate, so the generator's speed does not matter).
2. Fail-fast: p99 of an answer while the breaker is open vs the cache-hit poll (goal: no slower).
   Both from one gateway process with the backend dead, measured together: every connection alternates
   a hit and a refused request (benchmarks/paired_latency.py), with 1 connection (the answer's own
   latency) and 32 (the core benchmark's load); gateway and load each on a core of their own. Run
   apart, two wrk runs on this shared machine differ by more than these two paths do. The cache TTL
   is raised for this stack alone so that the hits stay hits while the backend is down.
3. Polling storm: 200 concurrent pollers on 50 finished tasks for 20 s (wrk); backend status calls per
   task per 5 s TTL window (goal <= 1.0).

Run: python -m benchmarks.bench_resilience [--only amplification|storm|fail-fast]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

import httpx

from benchmarks import paired_latency, wrk
from benchmarks.harness import AUTH, LOAD_CPU, Processes, pin, processes, submit_and_wait
from tests.conftest import backend_config, gateway_config
from tests.helpers import backend_requests
from tests.procs import Service
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


BREAKER_OPENS = {"fail_max": 5, "reset_timeout_sec": 600}


def amplification_cases(n: int) -> None:
    never_opens = {"fail_max": 10**9, "reset_timeout_sec": 600}
    with processes() as procs:
        ratio, errors = amplification(procs, 1.0, never_opens, "fail100", n)
        print(f"backend failing 100%, breaker closed: backend/client requests {ratio:.3f} (goal <= 1.2)")
        ratio, errors = amplification(procs, 1.0, BREAKER_OPENS, "fail100open", n, warmup=50)
        print(f"backend failing 100%, breaker open:   backend/client requests {ratio:.3f} (goal ~0)")
        ratio, errors = amplification(procs, 0.1, {"fail_max": 5, "reset_timeout_sec": 2}, "fail10", n)
        print(f"backend failing 10%:                  backend/client requests {ratio:.3f} (goal <= 1.15), "
              f"client-visible errors {errors:.2%} (goal < 1%)")


def storm(seconds: float) -> None:
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning"), "backend")
        config = tuned(gateway_config(procs.workdir, backend.url, log_level="error"), circuit_breaker=BREAKER_OPENS)
        gateway = procs.start("gateway", config, "gateway")
        ids = [submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"}) for _ in range(50)]
        before = backend_requests(backend.url)
        lua = "ids = {" + ",".join(f'"{i}"' for i in ids) + "}\n" + \
              'request = function() return wrk.format("GET", "/api/v1/exports/" .. ids[math.random(1, #ids)]) end\n'
        result = wrk.run(gateway.url, seconds=seconds, connections=200, headers=AUTH, lua=lua)
        calls = backend_requests(backend.url) - before
        windows = seconds / 5
        print(f"polling storm, 200 pollers, 50 tasks, {seconds:.0f} s: {result.line()}")
        print(f"  backend status calls {calls}: {calls / 50 / windows:.2f} per task per 5 s window (goal <= 1.0)")


def fail_fast(rounds: int) -> None:
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning"), "backend")
        config = tuned(gateway_config(procs.workdir, backend.url, log_level="error"),
                       circuit_breaker=BREAKER_OPENS, status_cache={"ttl_sec": 3600})
        gateway = procs.start("gateway", config, "gateway")
        pin(gateway)
        fail_fast_rounds(gateway.url, backend, rounds)


def fail_fast_rounds(gateway: str, backend: Service, rounds: int) -> None:
    done = submit_and_wait(gateway, {"export_type": "report_export"}, {"COMPLETED"})
    backend.kill()
    for _ in range(50):  # bounded: five failures open the breaker
        if httpx.get(f"{gateway}{API}", headers=AUTH, timeout=30).status_code == 503:
            break
    # one connection gives ~1,300 answers of each kind a second, so its rounds run longer for a p99 of as many
    for connections, seconds in ((1, 8), (32, 5)):
        ratios = []
        for i in range(rounds):
            hit, refused = paired_latency.run(f"{gateway}{API}/{done}", f"{gateway}{API}?limit=1", AUTH,
                                              connections, seconds, cpu=LOAD_CPU)
            ratios.append(refused.p99_ms / hit.p99_ms)
            print(f"{connections:2d} connections, round {i + 1}: cache hit {hit.line()}")
            print(f"{connections:2d} connections, round {i + 1}: breaker open {refused.line()}")
        print(f"  {connections} connections: p99 fail-fast / cache hit by round "
              f"{', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f} (goal <= 1.0)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="alternating fail-fast / cache-hit rounds")
    parser.add_argument("--only", choices=["amplification", "storm", "fail-fast"])
    args = parser.parse_args()
    if args.only in (None, "amplification"):
        amplification_cases(args.requests)
    if args.only in (None, "storm"):
        storm(args.seconds)
    if args.only in (None, "fail-fast"):
        fail_fast(args.rounds)


if __name__ == "__main__":
    main()
