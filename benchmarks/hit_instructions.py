"""CPU instructions a cache hit costs the gateway, counted by callgrind: independent of the machine's load.

The gateway's ASGI app is driven in process (no sockets, no server) for N cache
hits of one COMPLETED task held by a real backend process; the process runs
twice under `valgrind --tool=callgrind`, with N and 5N hits, and the difference
divided by 4N is one hit. `--miss` polls a RUNNING task instead, which the cache
does not keep: every poll is proxied to the backend (the backend's own work is in
its process, not counted). `--tracing otlp` exports to a local receiver at the
default ratio; `--before DIR` runs an earlier checkout's gateway the same way.
`--list` counts an uncached `GET /api/v1/exports?limit=1` instead (the backend answers
each; only the gateway's process is counted), and `--list --reference` the same call
through the minimal aiohttp proxy of benchmarks/reference_servers.py, driven the same way.

Run: python -m benchmarks.hit_instructions [--hits 400] [--miss] [--tracing off|otlp] [--before DIR]
                                           [--list [--reference]]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any, AsyncIterator, MutableMapping

ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[None]:
    """An ASGI app's lifespan, started and stopped as a server would."""
    started, stopping = asyncio.Event(), asyncio.Event()
    messages = iter([{"type": "lifespan.startup"}])

    async def receive() -> dict[str, Any]:
        for message in messages:
            return message
        await stopping.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    await started.wait()
    try:
        yield
    finally:
        stopping.set()
        await task


async def _drive(config_path: str, task_id: str, key: str, hits: int, mode: str) -> None:
    from exports_common.config_loader import load_model
    from gateway.app import create_app
    from gateway.config import GatewayConfig

    config = load_model(config_path, GatewayConfig)
    task_path = f"/api/v1/exports/{task_id}"
    path = {"hit": task_path, "miss": task_path, "list": "/api/v1/exports", "proxy": "/exports"}[mode]
    headers = [(b"host", b"gw"), (b"x-tenant-id", b"demo") if mode == "proxy" else
               (b"authorization", f"Bearer {key}".encode())]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"" if mode in ("hit", "miss") else b"limit=1",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }
    if mode == "proxy":
        from benchmarks.reference_servers import aiohttp_proxy

        app, lifespan = aiohttp_proxy(config.upstreams["exports"].urls[0]), None
    else:
        app = create_app(config, config_path)
        lifespan = app.lifespan(app.ops_app)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    statuses: list[int] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async with lifespan or _lifespan(app):
        await app(dict(scope), receive, send)  # the miss that fills the cache (or warms the connection pool)
        for _ in range(hits):
            await app(dict(scope), receive, send)
    assert set(statuses) == {200}, set(statuses)


def _instructions(code: Path, config_path: str, task_id: str, key: str, hits: int, mode: str) -> int:
    # here, not at the top: under callgrind this file runs another tree, which may lack them
    from benchmarks import callgrind
    from tests.conftest import RAISED_LIMITS
    from tests.procs import SERVICE_TOKEN_ENV

    python = code / ".venv" / "bin" / "python" if code != ROOT else Path(sys.executable)
    return callgrind.instructions(
        [str(python), str(Path(__file__)), "--drive", config_path, task_id, key, str(hits), mode],
        # callgrind runs the process ~50x slower: a 5 s batch would hold a tenth of the spans a real second's
        # traffic puts in one; 60 s keeps batches near their production size. The tenant limits raised as in
        # every benchmark (the limiter still runs): else how many hits pass depends on how slowly callgrind runs.
        # The backend answers only with its service token, which the gateway sends as the processes started here do
        RAISED_LIMITS | SERVICE_TOKEN_ENV | {"PYTHONPATH": str(code), "OTEL_BSP_SCHEDULE_DELAY": "60000"})


def main() -> None:
    if sys.argv[1:2] == ["--drive"]:
        config_path, task_id, key, hits, mode = sys.argv[2:7]
        asyncio.run(_drive(config_path, task_id, key, int(hits), mode))
        return
    from benchmarks.harness import AUTH, processes, submit_and_wait
    from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
    from tests.otlp_receiver import OtlpReceiver

    parser = argparse.ArgumentParser()
    parser.add_argument("--hits", type=int, default=400)
    parser.add_argument("--tracing", choices=["off", "otlp"], default="off")
    parser.add_argument("--before", type=Path)
    parser.add_argument("--miss", action="store_true", help="poll a RUNNING task: every poll goes to the backend")
    parser.add_argument("--list", action="store_true", help="an uncached list call instead of a cache hit")
    parser.add_argument("--reference", action="store_true", help="with --list: through the minimal aiohttp proxy")
    args = parser.parse_args()
    assert AUTH
    with OtlpReceiver() as collector, processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, export_types={
            "stuck_export": synthetic_type("orders", 1000, fault={"delay_sec": 3000})}), "backend")
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url), "gateway")
        task_id = (submit_and_wait(gateway.url, {"export_type": "stuck_export", "timeout_sec": 3600}, {"RUNNING"})
                   if args.miss else submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"}))
        config = gateway_config(procs.workdir / "measured", backend.url, log_level="warning")
        config["tracing"] = ({"exporter": "otlp", "endpoint": collector.url} if args.tracing == "otlp"
                             else {"exporter": "none"})
        for route in config["routes"]:
            # callgrind's pace makes a run last 10-60 s, as the load has it: with the 5 s TTL some hits were
            # misses (a million instructions each), which moved a run's figure by up to 4%
            route["plugins"] = [{"status_cache": {"ttl_sec": 3600}} if isinstance(p, dict) and "status_cache" in p
                                else p for p in route["plugins"]]
        import yaml

        measured = procs.workdir / "measured.yaml"
        measured.write_text(yaml.safe_dump(config))
        code = args.before.resolve() if args.before else ROOT
        mode = ("proxy" if args.reference else "list") if args.list else ("miss" if args.miss else "hit")
        few = _instructions(code, str(measured), task_id, DEMO_KEY, args.hits, mode)
        many = _instructions(code, str(measured), task_id, DEMO_KEY, 5 * args.hits, mode)
        label = f"before ({args.before})" if args.before else f"this code, tracing {args.tracing}"
        if args.reference:
            label = "minimal aiohttp proxy"
        what = "list limit=1" if args.list else f"cache {mode}"
        print(f"{what}, {label}: {(many - few) / (4 * args.hits):,.0f} instructions")


if __name__ == "__main__":
    main()
