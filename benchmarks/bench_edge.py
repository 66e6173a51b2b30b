"""The gateway's own edge pieces against uvicorn as it comes (issue 22): is each worth keeping?

- `exports_common/connection_limits.py`, the bounded httptools protocol, against uvicorn's
  stock httptools protocol (no bounds: the floor) and uvicorn's h11 protocol with its own
  bounds (`--h11-max-incomplete-event-size`, `--limit-concurrency`: the library's way to
  bound a header section and the connections);
- `exports_common/workers.py`, the pre-fork supervisor, against uvicorn's `--workers 2`
  (multiprocessing spawn; the app loaded by import string), both on one Redis.

The same app and config everywhere (`benchmarks/granian_gateway.py` loads it by import
string for stock uvicorn), the cache-hit status poll, unpinned, all variants measured in
turns (a load that comes and goes falls on each alike). Per variant: the best round's
rate and p99, and CPU µs per request (user + sys of the server's processes over the
round, divided by its requests: the figure least moved by other load on the machine).

Run: python -m benchmarks.bench_edge [--seconds 6] [--rounds 3]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import yaml

from benchmarks import wrk
from benchmarks.harness import AUTH, cpu_seconds, processes, submit_and_wait
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import ROOT, RedisServer, free_port, wait_until


@contextlib.contextmanager
def stock_uvicorn(config: dict[str, object], workdir: Path, name: str, http: str, workers: int
                  ) -> Iterator[tuple[str, int]]:
    """uvicorn's own command line serving the gateway's app: (url, pid)."""
    port = free_port()
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config | {"port": port}))
    limits = {"max_connections": 2048, "keep_alive_sec": 5}  # the config's defaults, as uvicorn options
    log = open(workdir / f"{name}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "benchmarks.granian_gateway:app", "--host", "127.0.0.1",
         "--port", str(port), "--loop", "uvloop", "--http", http, "--workers", str(workers), "--no-access-log",
         "--log-level", "warning", "--limit-concurrency", str(limits["max_connections"]),
         "--timeout-keep-alive", str(limits["keep_alive_sec"]), "--h11-max-incomplete-event-size", "16384"],
        cwd=ROOT, env=dict(os.environ, **RAISED_LIMITS, GATEWAY_CONFIG=str(path)), stdout=log,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, 60, what=name)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with processes() as procs, contextlib.ExitStack() as stack:
        workdir = procs.workdir
        redis = RedisServer(workdir).start()
        stack.callback(redis.stop)
        backend = procs.start("backend_stub", backend_config(workdir), "backend")
        (workdir / "first").mkdir()
        first = procs.start("gateway", gateway_config(workdir / "first", backend.url, log_level="warning"),
                            "first")
        done = submit_and_wait(first.url, {"export_type": "report_export"}, {"COMPLETED"})
        first.stop()
        path = f"/api/v1/exports/{done}"

        def config(name: str, redis_url: str = "") -> dict[str, object]:
            where = workdir / name
            where.mkdir()
            return gateway_config(where, backend.url, redis_url, log_level="warning", gateway_processes=2)

        servers: dict[str, tuple[str, int]] = {}
        for label, redis_url, workers in (("gateway (bounded httptools), 1 worker", "", 1),
                                          ("gateway supervisor, 2 workers", redis.url, 2)):
            gateway = procs.start("gateway", config(f"g{workers}", redis_url), f"gateway-{workers}w",
                                  args=("--workers", str(workers)))
            assert gateway.proc is not None
            servers[label] = (gateway.url, gateway.proc.pid)
        for label, http, redis_url, workers in (("uvicorn httptools, no bounds, 1 worker", "httptools", "", 1),
                                                ("uvicorn h11, its bounds, 1 worker", "h11", "", 1),
                                                ("uvicorn --workers 2 (httptools)", "httptools", redis.url, 2)):
            name = label.split(",")[0].replace(" ", "-") + f"-{workers}"
            servers[label] = stack.enter_context(stock_uvicorn(config(name, redis_url), workdir, name, http,
                                                               workers))
        for url, _ in servers.values():
            httpx.get(url + path, headers=AUTH)  # fills the cache
            wrk.run(url + path, seconds=1, headers=AUTH)  # warm-up
        best: dict[str, tuple[wrk.WrkResult, float]] = {}
        for _ in range(args.rounds):
            for label, (url, pid) in servers.items():
                before = cpu_seconds(pid)
                result = wrk.run(url + path, seconds=args.seconds, headers=AUTH)
                micros = (cpu_seconds(pid) - before) / max(1, result.requests) * 1e6
                if label not in best or result.rps > best[label][0].rps:
                    best[label] = (result, micros)
    for label, (result, micros) in best.items():
        print(f"{label:<42}{result.line()}   {micros:6.1f} µs/request")

    def ratio(ours: str, theirs: str) -> str:
        (a, a_us), (b, b_us) = best[ours], best[theirs]
        return (f"rate {a.rps / b.rps:.2f}x, p99 {a.p99_ms / b.p99_ms:.2f}x, CPU per request "
                f"{a_us / b_us:.2f}x")

    ours = "gateway (bounded httptools), 1 worker"
    print(f"bounded httptools / uvicorn httptools:   {ratio(ours, 'uvicorn httptools, no bounds, 1 worker')}")
    print(f"bounded httptools / uvicorn h11 bounded: {ratio(ours, 'uvicorn h11, its bounds, 1 worker')}")
    print(f"own supervisor / uvicorn --workers 2:    "
          f"{ratio('gateway supervisor, 2 workers', 'uvicorn --workers 2 (httptools)')}")


if __name__ == "__main__":
    main()
