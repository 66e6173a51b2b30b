"""Noisy neighbour (issue 12): tenant A floods submits, tenant B submits steadily, both through one gateway.

The gateway runs the shipped limits (20 submits/s, bursts of 100, per tenant). In the same run:
1. B alone: B submits at a steady pace; its submit latency and time-to-start (submit -> first poll
   that sees the task out of PENDING);
2. B while A floods submits with wrk (32 connections, as fast as they go): the same figures for B as
   ratios against 1 (goal: <= 2 for both), and the share of A's requests limited (429);
   the gateway is pinned to one core and the flood's wrk to the other in both phases. The gateway
   runs its shipped refusal_hold (a flood's 429s answered 0.5 s later); `--no-hold` turns it off;
3. (measured first, before any flood) the limiter's cost on the cache-hit path: a status poll
   answered from the cache by a gateway with the rate_limit plugin on every route and by one
   without it, each pinned to a core with wrk on the other, in alternated rounds, the median of
   each (goal: with / without >= 0.95); next to it the same two gateways' instructions per hit
   (benchmarks/server_instructions.py: server and app under callgrind), which load does not move.

The backend takes tasks in fair turns across tenants, so A's admitted backlog does not delay B's
beyond the task running when B submits; with `scheduler.default_max_running: 1` on its 2 workers
(as docs/operations/limits.md advises: a cap below the workers) one worker is always free for the other tenant.

Run: python -m benchmarks.bench_noisy_neighbour [--seconds 10] [--rounds 5] [--redis] [--no-hold]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import httpx

from benchmarks import wrk
from benchmarks.bench_gateway import best_of
from benchmarks.harness import LOAD_CPU, Processes, pin, processes, submit_and_wait
from benchmarks.server_instructions import long_ttl, per_request, without
from tests.conftest import DEMO2_KEY, DEMO_KEY, RAISED_LIMITS, backend_config, gateway_config, synthetic_type
from tests.procs import RedisServer

A = {"Authorization": f"Bearer {DEMO_KEY}"}
B = {"Authorization": f"Bearer {DEMO2_KEY}"}
SHIPPED = {"TENANT_REQUESTS_PER_SEC": "100", "TENANT_REQUESTS_BURST": "200", "TENANT_SUBMITS_PER_SEC": "20",
           "TENANT_SUBMITS_BURST": "100", "TENANT_MAX_ACTIVE_TASKS": "1000"}
TYPES = {"small_export": synthetic_type("report", 10, fault={"delay_sec": 0.05})}
BODY = '{"export_type": "small_export"}'
FLOOD = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def steady_b(url: str, seconds: float, per_sec: float = 4.0) -> tuple[list[float], list[float], int]:
    """B's submit latencies (ms), times-to-start (s) and submits refused, submitting `per_sec` for `seconds`."""
    refused = 0
    latencies: list[float] = []
    started: list[float] = []
    waiting: dict[str, float] = {}
    with httpx.Client(headers=B, timeout=30) as http:
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < deadline or (waiting and time.monotonic() < deadline + 60):
            now = time.monotonic()
            if now >= next_at and now < deadline:
                t0 = time.monotonic()
                resp = http.post(f"{url}/api/v1/exports", content=BODY, headers={"Content-Type": "application/json"})
                latencies.append((time.monotonic() - t0) * 1000)
                if resp.status_code == 202:
                    waiting[resp.json()["data"]["task_id"]] = t0
                else:
                    refused += 1
                next_at += 1 / per_sec
            for task_id, t0 in list(waiting.items()):
                status = http.get(f"{url}/api/v1/exports/{task_id}").json()["data"]["status"]
                if status != "PENDING":
                    started.append(time.monotonic() - t0)
                    del waiting[task_id]
            time.sleep(0.02)
    return latencies, started, refused


def limiter_cost(procs: Processes, backend_url: str, redis_url: str, seconds: float, rounds: int
                 ) -> tuple[float, float, float, float]:
    """Cache-hit polls per second with the rate_limit plugin and without it (limits raised: nothing refused),
    and the instructions per hit of each.

    Both gateways run side by side, each pinned to the server core while measured, in alternating
    rounds (with, without, with, without, ...): the median of each counts, so one round that another
    process slowed moves neither. Then each configuration runs under callgrind.
    """
    with_limits = gateway_config(procs.workdir, backend_url, redis_url, log_level="warning")
    without_limits = without(with_limits, "rate_limit")
    urls, paths = [], []
    for name, config in (("with", with_limits), ("without", without_limits)):
        gateway = procs.start("gateway", config, f"gateway-{name}-limits", env=RAISED_LIMITS)
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        pin(gateway)
        urls.append(f"{gateway.url}/api/v1/exports/{done}")
        paths.append(f"/api/v1/exports/{done}")
    rates: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, url in enumerate(urls):
            rates[i].append(best_of(1, url, seconds, A, cpu=LOAD_CPU).rps)
    counted = [per_request("gateway", long_ttl(config), path, A, 300, 8, procs.workdir)
               for config, path in ((with_limits, paths[0]), (without_limits, paths[1]))]
    return statistics.median(rates[0]), statistics.median(rates[1]), counted[0], counted[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds of the limiter's cost")
    parser.add_argument("--redis", action="store_true", help="limits shared through a private redis-server")
    parser.add_argument("--no-hold", action="store_true", help="answer every 429 at once (refusal_hold off)")
    args = parser.parse_args()
    with processes() as procs:
        redis = RedisServer(procs.workdir).start() if args.redis else None
        try:
            run(procs, redis.url if redis else "", args.seconds, args.rounds, hold=not args.no_hold)
        finally:
            if redis is not None:
                redis.stop()


def run(procs: Processes, redis_url: str, seconds: float, rounds: int, hold: bool) -> None:
    backend = procs.start("backend_stub", backend_config(procs.workdir, export_types=TYPES, log_level="warning",
                                                         workers=2, scheduler={"default_max_running": 1}), "backend")
    hit_with, hit_without, counted_with, counted_without = limiter_cost(procs, backend.url, redis_url,
                                                                        min(seconds, 8), rounds)
    config = gateway_config(procs.workdir, backend.url, redis_url, log_level="warning")
    if not hold:
        config["refusal_hold"] = {"hold_sec": 0}
    gateway = procs.start("gateway", config, "gateway", env=SHIPPED)
    # the gateway on a core of its own, the flood's wrk on the other, in both phases
    pin(gateway)
    alone_lat, alone_start, _ = steady_b(gateway.url, seconds)

    flood: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: flood.update(result=wrk.run(
        f"{gateway.url}/api/v1/exports", seconds=seconds + 2, headers=A, lua=FLOOD, cpu=LOAD_CPU)))
    thread.start()
    time.sleep(1)
    noisy_lat, noisy_start, refused = steady_b(gateway.url, seconds)
    thread.join()
    a: wrk.WrkResult = flood["result"]

    mode = "Redis" if redis_url else "in process"
    held = "a flood's 429s held 0.5 s" if hold else "every 429 at once"
    print(f"limits {mode}, {held}; B submits 4/s for {seconds:.0f} s, alone and while A floods")
    print(f"B submit p99   alone {p99(alone_lat):7.1f} ms   with A flooding {p99(noisy_lat):7.1f} ms   "
          f"ratio {p99(noisy_lat) / p99(alone_lat):.2f} (goal <= 2)")
    print(f"B submits refused while A flooded: {refused} of {len(noisy_lat)}")
    print(f"A: {a.requests} submits at {a.rps:.0f} req/s, {a.errors / a.requests:.1%} limited (429)")
    print(f"B time-to-start p99   alone {p99(alone_start):6.2f} s   with A flooding {p99(noisy_start):6.2f} s   "
          f"ratio {p99(noisy_start) / p99(alone_start):.2f} (goal <= 2)")
    print(f"cache-hit poll  with rate_limit {hit_with:7.0f} req/s   without {hit_without:7.0f} req/s   "
          f"ratio {hit_with / hit_without:.2f} (goal >= 0.95; medians of {rounds} alternated rounds)")
    print(f"cache-hit poll  with rate_limit {counted_with:7,.0f} instructions   without {counted_without:7,.0f}   "
          f"ratio {counted_without / counted_with:.2f} (server and app under callgrind)")


if __name__ == "__main__":
    main()
