"""The gateway's own edge pieces against uvicorn as it comes (issue 22): is each worth keeping?

- `exports_common/connection_limits.py`, the bounded httptools protocol, against uvicorn's
  stock httptools protocol (no bounds: the floor) and uvicorn's h11 protocol with its own
  bounds (`--h11-max-incomplete-event-size`, `--limit-concurrency`: the library's way to
  bound a header section and the connections);
- `run --workers 2` (uvicorn's supervisor, the gateway's config loaded in each worker,
  `exports_common/serving.py`) against uvicorn's own `--workers 2` command line, both on
  one Redis; with `--before DIR`, also an earlier checkout's `run --workers 2` (e.g. the
  pre-fork supervisor that `run --workers` had before issue 22), in the same turns.

The same app and config everywhere (`benchmarks/granian_gateway.py` loads it by import
string for stock uvicorn), the cache-hit status poll, unpinned, all variants measured in
turns (a load that comes and goes falls on each alike). Per variant: the best round's
rate and p99, and CPU µs per request (user + sys of the server's processes over the
round, divided by its requests: the figure least moved by other load on the machine).

Run: python -m benchmarks.bench_edge [--seconds 6] [--rounds 3] [--workers-only] [--before DIR]
(`--workers-only`: the 2-worker variants alone; DIR: a checkout with its own .venv, e.g.
`git -C REPO archive main | tar -x -C DIR` and a link to this .venv)
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
from benchmarks.harness import AUTH, cpu_per_request, processes, submit_and_wait
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import ROOT, SERVICE_TOKEN_ENV, RedisServer, free_port, wait_until

ONE = "gateway (bounded httptools), 1 worker"
TWO = "gateway run --workers 2"
BEFORE = "before: gateway run --workers 2"
STOCK_ONE = "uvicorn httptools, no bounds, 1 worker"
STOCK_H11 = "uvicorn h11, its bounds, 1 worker"
STOCK_TWO = "uvicorn --workers 2 (httptools)"


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
        cwd=ROOT, env=dict(os.environ, **RAISED_LIMITS, **SERVICE_TOKEN_ENV, GATEWAY_CONFIG=str(path)), stdout=log,
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
    parser.add_argument("--workers-only", action="store_true", help="only the 2-worker variants")
    parser.add_argument("--before", type=Path, help="an earlier checkout: its `run --workers 2` too")
    args = parser.parse_args()
    with processes() as procs, contextlib.ExitStack() as stack:
        workdir = procs.workdir
        redis = RedisServer(workdir).start()
        stack.callback(redis.stop)
        backend = procs.start("backend_stub", backend_config(workdir), "backend", timeout=60)
        (workdir / "first").mkdir()
        first = procs.start("gateway", gateway_config(workdir / "first", backend.url, log_level="warning"),
                            "first", timeout=60)
        done = submit_and_wait(first.url, {"export_type": "report_export"}, {"COMPLETED"})
        first.stop()
        path = f"/api/v1/exports/{done}"

        def config(name: str, redis_url: str = "") -> dict[str, object]:
            where = workdir / name
            where.mkdir()
            return gateway_config(where, backend.url, redis_url, log_level="warning", gateway_processes=2)

        servers: dict[str, tuple[str, int]] = {}
        ours: list[tuple[str, str, int, Path | None]] = [] if args.workers_only else [(ONE, "", 1, None)]
        ours.append((TWO, redis.url, 2, None))
        if args.before:
            ours.append((BEFORE, redis.url, 2, args.before.resolve()))
        for label, redis_url, workers, root in ours:
            name = f"gateway-{workers}w" + ("-before" if root else "")
            gateway = procs.start("gateway", config(name, redis_url), name, root=root,
                                  args=("--workers", str(workers)))
            assert gateway.proc is not None
            servers[label] = (gateway.url, gateway.proc.pid)
        stock = [(STOCK_TWO, "httptools", redis.url, 2)]
        if not args.workers_only:
            stock[:0] = [(STOCK_ONE, "httptools", "", 1), (STOCK_H11, "h11", "", 1)]
        for label, http, redis_url, workers in stock:
            name = label.split(",")[0].replace(" ", "-") + f"-{workers}"
            servers[label] = stack.enter_context(stock_uvicorn(config(name, redis_url), workdir, name, http,
                                                               workers))
        for url, _ in servers.values():
            httpx.get(url + path, headers=AUTH)  # fills the cache
            wrk.run(url + path, seconds=1, headers=AUTH)  # warm-up
        best: dict[str, tuple[wrk.WrkResult, float]] = {}
        for _ in range(args.rounds):
            for label, (url, pid) in servers.items():
                micros, result = cpu_per_request(pid, url + path, args.seconds, AUTH)
                if label not in best or result.rps > best[label][0].rps:
                    best[label] = (result, micros)
    for label, (result, micros) in best.items():
        print(f"{label:<42}{result.line()}   {micros:6.1f} µs/request")

    def ratio(ours: str, theirs: str) -> str:
        (a, a_us), (b, b_us) = best[ours], best[theirs]
        return (f"rate {a.rps / b.rps:.2f}x, p99 {a.p99_ms / b.p99_ms:.2f}x, CPU per request "
                f"{a_us / b_us:.2f}x")

    if not args.workers_only:
        print(f"bounded httptools / uvicorn httptools:   {ratio(ONE, STOCK_ONE)}")
        print(f"bounded httptools / uvicorn h11 bounded: {ratio(ONE, STOCK_H11)}")
    print(f"run --workers 2 / uvicorn --workers 2:   {ratio(TWO, STOCK_TWO)}")
    if args.before:
        print(f"run --workers 2, this code / before:     {ratio(TWO, BEFORE)}")

if __name__ == "__main__":
    main()
