"""Gateway core benchmarks (issues 3 and 16), each a ratio against a reference measured in the same run.

1. cache-hit status poll through the full plugin chain  vs  a bare Starlette app returning the same JSON
   (goal >= 0.7); each server pinned to one core and wrk to the other while measured;
2. uncached list (`GET /api/v1/exports?limit=1`: no cache, no coalescing, the signed link rewritten)
   vs  a minimal aiohttp-client proxy to the same backend (goal >= 0.8, p99 within 2x);
3. proxied status poll (cache miss: a RUNNING task, where coalescing helps) vs the same proxy (reported);
4. scaling: the cache-hit poll on `run --workers 2` vs `--workers 1`, both on one Redis, unpinned
   (goal >= 1.4x; wrk needs part of a core of the two);
5. all of it against nginx (static answer / proxy_pass) when nginx is installed (reported, no goal).

Every server runs on uvicorn with uvloop and httptools; the gateways with the tenant limits raised
through their environment variables (the limiter still runs on every request).

Run: python -m benchmarks.bench_gateway [--seconds 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import httpx

from benchmarks import wrk
from benchmarks.harness import AUTH, LOAD_CPU, Processes, nginx, pin, processes, submit_and_wait, unpin
from tests.conftest import backend_config, gateway_config, synthetic_type
from tests.procs import RedisServer, Service

TENANT = {"X-Tenant-Id": "demo"}  # what the gateway's auth would send upstream; the proxies pass it through


def best_of(rounds: int, url: str, seconds: float, headers: dict[str, str], cpu: int | None = None
            ) -> wrk.WrkResult:
    wrk.run(url, seconds=1, headers=headers, cpu=cpu)  # warm-up: pools, caches, JIT-free but page-cache warm
    results = [wrk.run(url, seconds=seconds, headers=headers, cpu=cpu) for _ in range(rounds)]
    return max(results, key=lambda r: r.rps)


def compare(label: str, ours: wrk.WrkResult, ref_label: str, ref: wrk.WrkResult, goal: str) -> None:
    print(f"{label:<34}{ours.line()}")
    print(f"{ref_label:<34}{ref.line()}")
    print(f"  ratio {ours.rps / ref.rps:.2f} ({goal}), p99 {ours.p99_ms / ref.p99_ms:.2f}x of the reference")


def scaling(procs: Processes, backend: Service, task_id: str, rounds: int, seconds: float) -> None:
    """The hit path on one Redis with 1 and then 2 worker processes, same machine, same run."""
    redis = RedisServer(procs.workdir).start()
    try:
        rates = {}
        for workers in (1, 2):
            # the same config for both: gateway_processes matters only while Redis is unreachable
            config = gateway_config(procs.workdir, backend.url, redis.url, log_level="warning", gateway_processes=2)
            gateway = procs.start("gateway", config, f"gateway-redis-{workers}w", args=("--workers", str(workers)))
            url = f"{gateway.url}/api/v1/exports/{task_id}"
            httpx.get(url, headers=AUTH)  # fills the shared cache
            rates[workers] = best_of(rounds, url, seconds, AUTH)
            gateway.stop()
        print(f"cache-hit poll, Redis, 1 worker   {rates[1].line()}")
        print(f"cache-hit poll, Redis, 2 workers  {rates[2].line()}")
        print(f"  scaling {rates[2].rps / rates[1].rps:.2f}x (goal >= 1.40), "
              f"p99 {rates[2].p99_ms / rates[1].p99_ms:.2f}x of one worker")
    finally:
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    with processes() as procs:
        workdir = procs.workdir
        backend = procs.start("backend_stub", backend_config(workdir, export_types={
            "stuck_export": synthetic_type("orders", 1000, fault={"delay_sec": 3000})}), "backend")
        gateway = procs.start("gateway", gateway_config(workdir, backend.url, log_level="warning"), "gateway")
        running = submit_and_wait(gateway.url, {"export_type": "stuck_export", "timeout_sec": 3600}, {"RUNNING"})
        # submitted last, so the newest task (what `limit=1` lists) is a finished one with a link to sign
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        hit_url = f"{gateway.url}/api/v1/exports/{done}"
        list_url = f"{gateway.url}/api/v1/exports?limit=1"
        body = httpx.get(hit_url, headers=AUTH).content
        body_file = workdir / "hit.json"
        body_file.write_bytes(body)
        assert "sig=" in httpx.get(list_url, headers=AUTH).text, "the listed task must carry a link to sign"
        bare = procs.start("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body_file)}, "bare")
        proxy = procs.start("benchmarks.reference_servers", {"kind": "aiohttp_proxy", "upstream": backend.url},
                            "aiohttp-proxy")

        r = args.rounds
        # a hit is one process's work: each server on a core of its own, wrk on the other
        for server in (gateway, bare):
            pin(server)
        hit = best_of(r, hit_url, args.seconds, AUTH, cpu=LOAD_CPU)
        hit_ref = best_of(r, f"{bare.url}/api/v1/exports/{done}", args.seconds, {}, cpu=LOAD_CPU)
        unpin(gateway)  # a proxied call is two processes' work (gateway and backend): left to the scheduler
        listed = best_of(r, list_url, args.seconds, AUTH)
        listed_ref = best_of(r, f"{proxy.url}/exports?limit=1", args.seconds, TENANT)
        miss = best_of(r, f"{gateway.url}/api/v1/exports/{running}", args.seconds, AUTH)
        miss_ref = best_of(r, f"{proxy.url}/exports/{running}", args.seconds, TENANT)
        assert httpx.get(f"{gateway.url}/api/v1/exports/{running}", headers=AUTH).headers["x-cache"] == "MISS"

        compare("cache-hit poll, gateway", hit, "cache-hit poll, bare Starlette", hit_ref, "goal >= 0.70")
        compare("list limit=1, gateway", listed, "list limit=1, aiohttp proxy", listed_ref,
                "goal >= 0.80, p99 <= 2.00x")
        compare("cache-miss poll, gateway", miss, "cache-miss poll, aiohttp proxy", miss_ref, "coalescing helps")
        if not args.skip_scaling:
            gateway.stop()  # its core is the second worker's now
            scaling(procs, backend, done, r, args.seconds)
        with nginx(backend.url, Path(body_file)) as nginx_url:
            if nginx_url is None:
                print("nginx: not installed; comparison skipped (apt-get install nginx-light)")
                return
            static = best_of(r, f"{nginx_url}/static", args.seconds, {})
            proxied = best_of(r, f"{nginx_url}/exports?limit=1", args.seconds, TENANT)
            print(f"{'nginx static answer':<34}{static.line()}")
            print(f"{'nginx proxy_pass, list':<34}{proxied.line()}")
            print(f"  gateway/nginx: cache hit {hit.rps / static.rps:.2f}, list {listed.rps / proxied.rps:.2f}")


if __name__ == "__main__":
    main()
