"""Gateway core benchmarks (issue 3), each a ratio against a reference measured in the same run.

1. cache-hit status poll through the full plugin chain  vs  a bare Starlette app returning the same JSON
   (goal >= 0.7); each server pinned to one core and wrk to the other while measured;
2. proxied status poll (cache miss: a RUNNING task)      vs  a minimal aiohttp-client proxy to the same
   backend (goal >= 0.8, p99 within 2x);
3. both against nginx (static answer / proxy_pass) when nginx is installed (reported, no goal).

Run: python -m benchmarks.bench_gateway [--seconds 8]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import httpx

from benchmarks import wrk
from benchmarks.harness import AUTH, LOAD_CPU, nginx, pin, processes, submit_and_wait, unpin
from tests.conftest import backend_config, gateway_config


def best_of(rounds: int, url: str, seconds: float, headers: dict[str, str], cpu: int | None = None
            ) -> wrk.WrkResult:
    wrk.run(url, seconds=1, headers=headers, cpu=cpu)  # warm-up: pools, caches, JIT-free but page-cache warm
    results = [wrk.run(url, seconds=seconds, headers=headers, cpu=cpu) for _ in range(rounds)]
    return max(results, key=lambda r: r.rps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with processes() as procs:
        workdir = procs.workdir
        backend = procs.start("backend_stub", backend_config(workdir, export_types={
            "stuck_export": {"dataset": "orders", "rows": 1000, "fault": {"delay_sec": 3000}}}), "backend")
        gateway = procs.start("gateway", gateway_config(workdir, backend.url, log_level="warning"), "gateway")
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        running = submit_and_wait(gateway.url, {"export_type": "stuck_export", "timeout_sec": 3600}, {"RUNNING"})
        hit_url = f"{gateway.url}/api/v1/exports/{done}"
        body = httpx.get(hit_url, headers=AUTH).content
        body_file = workdir / "hit.json"
        body_file.write_bytes(body)
        bare = procs.start("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body_file)}, "bare")
        proxy = procs.start("benchmarks.reference_servers", {"kind": "aiohttp_proxy", "upstream": backend.url},
                            "aiohttp-proxy")

        r = args.rounds
        # a hit is one process's work: each server on a core of its own, wrk on the other
        for server in (gateway, bare):
            pin(server)
        hit = best_of(r, hit_url, args.seconds, AUTH, cpu=LOAD_CPU)
        hit_ref = best_of(r, f"{bare.url}/api/v1/exports/{done}", args.seconds, {}, cpu=LOAD_CPU)
        unpin(gateway)  # a miss is two processes' work (gateway and backend): left to the scheduler
        miss = best_of(r, f"{gateway.url}/api/v1/exports/{running}", args.seconds, AUTH)
        miss_ref = best_of(r, f"{proxy.url}/exports/{running}", args.seconds, {"X-Tenant-Id": "demo"})
        assert httpx.get(f"{gateway.url}/api/v1/exports/{running}", headers=AUTH).headers["x-cache"] == "MISS"

        print(f"cache-hit poll, gateway       {hit.line()}")
        print(f"cache-hit poll, bare Starlette {hit_ref.line()}")
        print(f"  ratio {hit.rps / hit_ref.rps:.2f} (goal >= 0.70)")
        print(f"cache-miss poll, gateway      {miss.line()}")
        print(f"cache-miss poll, aiohttp proxy {miss_ref.line()}")
        print(f"  ratio {miss.rps / miss_ref.rps:.2f} (goal >= 0.80), p99 {miss.p99_ms / miss_ref.p99_ms:.2f}x "
              f"(goal <= 2.0)")
        with nginx(backend.url, Path(body_file)) as nginx_url:
            if nginx_url is None:
                print("nginx: not installed; comparison skipped (apt-get install nginx-light)")
                return
            static = best_of(r, f"{nginx_url}/static", args.seconds, {})
            proxied = best_of(r, f"{nginx_url}/exports/{running}", args.seconds, {"X-Tenant-Id": "demo"})
            print(f"nginx static answer           {static.line()}")
            print(f"nginx proxy_pass              {proxied.line()}")
            print(f"  gateway/nginx: cache hit {hit.rps / static.rps:.2f}, cache miss {miss.rps / proxied.rps:.2f}")


if __name__ == "__main__":
    main()
