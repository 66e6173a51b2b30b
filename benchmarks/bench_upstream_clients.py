"""The gateway's upstream client against four maintained libraries (issue 22): aiohttp, aiosonic, pyreqwest, curl-cffi.

One workload for all five: a pooled keep-alive GET of a list body (the backend's answer to
`GET /exports?limit=3`, 1.7 KiB of JSON) from nginx on a free port, read whole, with a connect
and a read timeout set as the gateway sets them; N calls one after another, and N calls 32 in
flight. Each client runs in a process of its own on uvloop (as the gateway), warmed up first.

- CPU µs per call: user + sys of the client's process (sys also apart) (all its threads: pyreqwest's Tokio
  runtime counts) over the measured calls, divided by the calls; rounds alternate the clients
  (the order turns each round) and the median of the rounds is reported, with p99 per call.
- `--callgrind`: instructions per call, load-independent: each client's process under
  `valgrind --tool=callgrind` with C and 5C calls, the difference over 4C (a Rust or C
  library's instructions count too).

    pip install -e '.[bench]'   # aiosonic, pyreqwest, curl-cffi: compared here only, not dependencies
    python -m benchmarks.bench_upstream_clients [--calls 4000] [--rounds 3] [--concurrency 32] [--callgrind]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

from benchmarks.callgrind import instructions
from benchmarks.harness import nginx

CLIENTS = ("ours", "aiohttp", "aiosonic", "pyreqwest", "curl_cffi")
# what the gateway sends upstream on a list call, besides host
HEADERS = [("accept", "application/json"), ("x-tenant-id", "demo"), ("authorization", "Bearer service-token"),
           ("x-request-id", "0f2b4c6d8e0a1c3e5f7a9b1d3f5a7c9e")]
CONNECT_SEC, READ_SEC = 2.0, 30.0
POOL = 64
WARM_UP = 200
ROOT = Path(__file__).resolve().parent.parent

Call = Callable[[], Awaitable[bytes]]


def list_body(items: int = 3) -> bytes:
    """A page of the backend's task list: `items` finished tasks, each as the backend lists it."""
    tasks = []
    for n in range(items):
        task_id = f"exp-20261201-{n:020d}"
        tasks.append({
            "task_id": task_id, "export_type": "report_export", "status": "COMPLETED", "progress": 100,
            "current_step": None, "attempt": 1, "created_at": "2026-12-01T23:59:20.598Z",
            "updated_at": "2026-12-01T23:59:20.795Z",
            "result": {"download_url": f"/exports/{task_id}/file", "expire_at": "2026-12-02T23:59:20.795Z",
                       "rows": 20000, "bytes": 718332, "format": "csv", "compression": None},
            "error": None, "degraded": False, "callback": None, "reruns": 0, "format": "csv", "timeout_sec": 300,
            "change_id": f"{n:020d}"})
    page = {"code": 0, "message": "success", "data": {"items": tasks, "next_cursor": None}}
    return json.dumps(page, separators=(",", ":")).encode()


@contextlib.asynccontextmanager
async def ours(url: str) -> AsyncIterator[Call]:
    from gateway.http_client import HttpClient
    from gateway.upstream import Timeouts

    client = HttpClient(POOL)
    timeouts = Timeouts(connect=CONNECT_SEC, read=READ_SEC)

    async def call() -> bytes:
        answer = await client.request("GET", url, HEADERS, None, timeouts)
        return await answer.read()  # bounded by the answer size limit, as the gateway reads

    try:
        yield call
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def with_aiohttp(url: str) -> AsyncIterator[Call]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SEC, sock_read=READ_SEC)
    headers = dict(HEADERS)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=POOL), timeout=timeout) as session:

        async def call() -> bytes:
            async with session.get(url, headers=headers) as answer:
                return await answer.read()

        yield call


@contextlib.asynccontextmanager
async def with_aiosonic(url: str) -> AsyncIterator[Call]:
    from aiosonic import HTTPClient
    from aiosonic.connectors import TCPConnector
    from aiosonic.pools import PoolConfig
    from aiosonic.timeout import Timeouts

    timeouts = Timeouts(sock_connect=CONNECT_SEC, sock_read=READ_SEC, request_timeout=None)
    connector = TCPConnector(pool_configs={":default": PoolConfig(size=POOL)}, timeouts=timeouts)
    client = HTTPClient(connector=connector)
    headers = dict(HEADERS)

    async def call() -> bytes:
        answer = await client.get(url, headers=headers)
        return await answer.content()

    try:
        yield call
    finally:
        await client.connector.cleanup()


@contextlib.asynccontextmanager
async def with_pyreqwest(url: str) -> AsyncIterator[Call]:
    from pyreqwest.client import ClientBuilder

    builder = ClientBuilder().connect_timeout(timedelta(seconds=CONNECT_SEC))
    client = builder.read_timeout(timedelta(seconds=READ_SEC)).http1_only().build()
    headers = dict(HEADERS)

    async def call() -> bytes:
        answer = await client.get(url).headers(headers).build().send()
        return bytes(await answer.bytes())

    async with client:
        yield call


@contextlib.asynccontextmanager
async def with_curl_cffi(url: str) -> AsyncIterator[Call]:
    from curl_cffi.requests import AsyncSession

    headers = dict(HEADERS)
    async with AsyncSession(max_clients=POOL, timeout=(CONNECT_SEC, READ_SEC)) as session:

        async def call() -> bytes:
            answer = await session.get(url, headers=headers)
            return answer.content

        yield call


OPEN: dict[str, Callable[[str], contextlib.AbstractAsyncContextManager[Call]]] = {
    "ours": ours, "aiohttp": with_aiohttp, "aiosonic": with_aiosonic, "pyreqwest": with_pyreqwest,
    "curl_cffi": with_curl_cffi,
}


async def drive(client: str, url: str, calls: int, concurrency: int) -> dict[str, float]:
    """`calls` GETs in `concurrency` lanes after a warm-up: CPU µs per call, p50 and p99 in ms."""
    async with OPEN[client](url) as call:
        size = len(await call())
        took: list[float] = []

        async def lane(count: int) -> None:
            for _ in range(count):
                start = time.perf_counter()
                got = await call()
                took.append(time.perf_counter() - start)
                if len(got) != size:
                    raise RuntimeError(f"{client}: {len(got)} bytes read, {size} expected")

        await asyncio.gather(*(lane(WARM_UP // concurrency + 1) for _ in range(concurrency)))
        took.clear()
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(lane(calls // concurrency) for _ in range(concurrency)))
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    system = after.ru_stime - before.ru_stime
    cpu = after.ru_utime - before.ru_utime + system
    cuts = statistics.quantiles(took, n=100)
    return {"cpu_us": cpu / len(took) * 1e6, "sys_us": system / len(took) * 1e6, "p50_ms": cuts[49] * 1e3,
            "p99_ms": cuts[98] * 1e3, "calls_per_sec": len(took) / wall}


def child(client: str, url: str, calls: int, concurrency: int) -> dict[str, float]:
    """One client's run in a process of its own."""
    argv = [sys.executable, "-m", "benchmarks.bench_upstream_clients", "drive", client, url, str(calls),
            str(concurrency)]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"{client} failed:\n{run.stderr[-3000:]}")
    result: dict[str, float] = json.loads(run.stdout)
    return result


def per_call_instructions(client: str, url: str, calls: int, concurrency: int) -> float:
    """Instructions one call costs `client`, by callgrind: runs with `calls` and 5x `calls`, difference over 4x."""
    argv = [sys.executable, "-m", "benchmarks.bench_upstream_clients", "drive", client, url]
    env = {"PYTHONPATH": str(ROOT)}
    small = instructions([*argv, str(calls), str(concurrency)], env)
    large = instructions([*argv, str(5 * calls), str(concurrency)], env)
    return (large - small) / (4 * calls)


def counted_all(url: str, calls: int, concurrency: int) -> dict[str, float]:
    """Every client's instructions per call, two valgrind runs at a time (counts do not depend on the load)."""
    with ThreadPoolExecutor(2) as pool:
        found = pool.map(lambda name: per_call_instructions(name, url, calls, concurrency), CLIENTS)
        return dict(zip(CLIENTS, found, strict=True))


def timed(url: str, calls: int, rounds: int, concurrency: int) -> dict[str, list[dict[str, float]]]:
    """Every client's runs, in turns (the first client of a round moves one along each round)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
    for round_ in range(rounds):
        order = CLIENTS[round_ % len(CLIENTS):] + CLIENTS[:round_ % len(CLIENTS)]
        for name in order:
            runs[name].append(child(name, url, calls, concurrency))
    return runs


def report(title: str, runs: dict[str, list[dict[str, float]]], counted: dict[str, float]) -> None:
    medians = {name: {key: statistics.median(run[key] for run in got) for key in got[0]} for name, got in runs.items()}
    ours_us = medians["ours"]["cpu_us"]
    print(f"{title} (medians of {len(runs['ours'])} rounds)")
    print(f"  {'client':<10}{'CPU µs/call':>12}{'/ ours':>8}{'of it sys':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'calls/s':>9}{'instr/call':>12}")
    for name, m in medians.items():
        instr = f"{counted[name]:>12,.0f}" if name in counted else ""
        print(f"  {name:<10}{m['cpu_us']:>12.1f}{m['cpu_us'] / ours_us:>7.2f}x{m['sys_us']:>10.1f}{m['p50_ms']:>9.2f}"
              f"{m['p99_ms']:>9.2f}{m['calls_per_sec']:>9,.0f}{instr}")
    best = min((name for name in medians if name != "ours"), key=lambda name: medians[name]["cpu_us"])
    margin = medians[best]["cpu_us"] / ours_us - 1
    print(f"  best library: {best}, {margin:+.0%} CPU per call against ours "
          f"({'ours wins by >= 15%' if margin >= 0.15 else 'WITHIN 15%: the rule sends the client back'})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", nargs="?", choices=["drive"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per call")
    parser.add_argument("--callgrind-calls", type=int, default=320)
    args = parser.parse_args()
    if args.command == "drive":
        import uvloop

        client, url, calls, concurrency = args.args
        print(json.dumps(uvloop.run(drive(client, url, int(calls), int(concurrency)))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        body = Path(tmp) / "list.json"
        body.write_bytes(list_body())
        # every path answers the body: nothing is proxied, so the upstream named here is never called
        with nginx("http://127.0.0.1:9", body, static_everywhere=True) as static:
            if static is None:
                raise SystemExit("nginx is needed as the upstream (apt-get install nginx-light)")
            url = f"{static.url}/exports?limit=3"
            print(f"body {len(body.read_bytes())} bytes; load average at start {os.getloadavg()}")
            for title, lanes in (("sequential", 1), (f"{args.concurrency} in flight", args.concurrency)):
                counted = counted_all(url, args.callgrind_calls // lanes * lanes, lanes) if args.callgrind else {}
                runs = timed(url, args.calls // lanes * lanes, args.rounds, lanes)
                report(title, runs, counted)
            print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
