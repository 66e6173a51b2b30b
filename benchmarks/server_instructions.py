"""Instructions per cache hit of a whole server process (uvicorn's work and the app's), counted by callgrind.

The wall-clock ratio of bench_gateway (gateway / bare Starlette, one core each) is a
ratio of whole processes: uvicorn's parsing and writing count as much as the app. Here
each server runs under `valgrind --tool=callgrind` (instrumented only once it answers),
and a client outside it sends N and then 5N keep-alive requests over real sockets
(`--connections` at once, as wrk does), each window's counts zeroed before and dumped
after; the difference divided by 4N is one request, independent of the machine's load.
The predicted wall-clock ratio is bare / gateway instructions per request. `--without P` also
counts the gateway with plugin P dropped from every route; `--before DIR` (repeatable) another
checkout's gateway (its own .venv) the same way. `--library-frame` also counts the same config's routes and
chains served through the libraries' frame (benchmarks/library_frame.py: Starlette's routing,
request and response, a handler per plugin, `asyncio.timeout`, the OpenTelemetry SDK's span), for
the hit and for an uncached list call (`GET /api/v1/exports?limit=1`, proxied to the backend, whose
work is in its own process), each as the gateway / library-frame ratio; both servers' answers are
compared first (status, body, the echoed `x-request-id`). `--aiohttp-client` also counts the list
call against the same gateway with aiohttp's `ClientSession` as its upstream client
(benchmarks/aiohttp_upstream.py), each side twice, in turns, after comparing both servers' answers.

Run: python -m benchmarks.server_instructions [--requests 300] [--connections 8] [--without rate_limit]
                                              [--before DIR] [--library-frame] [--aiohttp-client]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import callgrind
from benchmarks.harness import AUTH, processes, submit_and_wait
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import ROOT, SERVICE_TOKEN_ENV, free_port, wait_until


async def _client(port: int, request: bytes, n: int, connections: int) -> None:
    """`n` requests over `connections` keep-alive connections, each sent once the one before was answered."""
    left = [n]

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            await reader.readexactly(length)
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120)


def long_ttl(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with an hour's status cache TTL: at callgrind's pace a 5 s one turns hits into misses."""
    return config | {"routes": [route | {"plugins": [
        {"status_cache": {"ttl_sec": 3600}} if isinstance(p, dict) and "status_cache" in p else p
        for p in route["plugins"]]} for route in config["routes"]]}


def without(config: dict[str, Any], plugin: str) -> dict[str, Any]:
    """`config` with `plugin` dropped from every route."""
    return config | {"routes": [route | {"plugins": [
        p for p in route["plugins"] if (p if isinstance(p, str) else next(iter(p))) != plugin]}
        for route in config["routes"]]}


LIST_PATH = "/api/v1/exports?limit=1"
REQUEST_ID = "same-answer-check"


def same_answers(one: str, other: str, paths: list[str]) -> None:
    """Both servers answer each path (in turn, so a cache fills on both) with the same status and body."""
    headers = AUTH | {"x-request-id": REQUEST_ID}
    for path in paths:
        answers = [httpx.get(url + path, headers=headers, timeout=30) for url in (one, other)]
        assert [a.status_code for a in answers] == [200, 200], (path, [a.text for a in answers])
        assert answers[0].content == answers[1].content, (path, [a.text for a in answers])
        assert [a.headers["x-request-id"] for a in answers] == [REQUEST_ID] * 2, path


def per_request(module: str, config: dict[str, Any], path: str, headers: dict[str, str], n: int,
                connections: int, workdir: Path, root: Path = ROOT) -> float:
    """One server's instructions per request: windows of N and 5N requests, the difference over 4N."""
    config = config | {"port": free_port()}
    config_file = workdir / f"{module}-{config['port']}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = workdir / f"{module}.callgrind"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         str(root / ".venv" / "bin" / "python"), "-m", module, "run", "--config", str(config_file)],
        cwd=root, env=os.environ | RAISED_LIMITS | SERVICE_TOKEN_ENV, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{config['port']}\r\n"
               + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{config['port']}/healthz", timeout=5).status_code == 200,
                   300, interval=1, what=f"{module} under callgrind")
        _control(proc.pid, "--instr=on")
        asyncio.run(_client(config["port"], request, 50, connections))  # warm: the cache filled, code paths run
        counts = []
        for k, requests in enumerate((n, 5 * n), start=1):
            _control(proc.pid, "--zero")
            asyncio.run(_client(config["port"], request, requests, connections))
            _control(proc.pid, "--dump")
            counts.append(callgrind.totals(Path(f"{out}.{k}")))
        return (counts[1] - counts[0]) / (4 * n)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def client_cost(config: dict[str, Any], n: int, connections: int, workdir: Path) -> None:
    """The list call's instructions with the gateway's own upstream client and with aiohttp's, each twice in turns."""
    sides = {"gateway's client": "gateway", "aiohttp ClientSession": "benchmarks.aiohttp_upstream"}
    counted: dict[str, list[float]] = {label: [] for label in sides}
    for _ in range(2):
        for label, module in sides.items():
            counted[label].append(per_request(module, config, LIST_PATH, AUTH, n, connections, workdir))
            print(f"{'list call, ' + label + ':':<42}{counted[label][-1]:9,.0f} instructions per request")
    ours, theirs = (min(runs) for runs in counted.values())
    print(f"list call, gateway's client / aiohttp ClientSession (each side's lower run) {ours / theirs:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--without", action="append", default=[], metavar="PLUGIN",
                        help="also measure the gateway with this plugin dropped from every route")
    parser.add_argument("--before", type=Path, action="append", default=[],
                        help="also measure another checkout's gateway (repeatable: each in the same run)")
    parser.add_argument("--library-frame", action="store_true",
                        help="also measure the same chains through the libraries' frame (hit and list call)")
    parser.add_argument("--aiohttp-client", action="store_true",
                        help="also measure the list call with aiohttp's ClientSession as the upstream client")
    args = parser.parse_args()
    with processes() as procs, tempfile.TemporaryDirectory(prefix="server-instructions-") as tmp:
        backend = procs.start("backend_stub", backend_config(procs.workdir), "backend")
        served = gateway_config(procs.workdir, backend.url)
        gateway = procs.start("gateway", served, "gateway")
        task_id = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        path = f"/api/v1/exports/{task_id}"
        body_file = Path(tmp) / "hit.json"
        body_file.write_bytes(httpx.get(gateway.url + path, headers=AUTH).content)
        if args.library_frame:
            # the gateway's public URL too (signed links name it): only the port differs
            reference = procs.start("benchmarks.library_frame", served | {"port": free_port()}, "library-frame",
                                    env=RAISED_LIMITS)
            same_answers(gateway.url, reference.url, [path, path, LIST_PATH])
            reference.stop()
        if args.aiohttp_client:
            reference = procs.start("benchmarks.aiohttp_upstream", served | {"port": free_port()}, "aiohttp-client",
                                    env=RAISED_LIMITS)
            same_answers(gateway.url, reference.url, [LIST_PATH, LIST_PATH])
            reference.stop()
        gateway.stop()
        measured = long_ttl(gateway_config(procs.workdir, backend.url, log_level="warning"))
        bare = per_request("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body_file)},
                           path, {}, args.requests, args.connections, Path(tmp))
        print(f"{'bare Starlette:':<36}{bare:9,.0f} instructions per request")
        runs = [("gateway", measured, ROOT)] + [(f"gateway without {p}", without(measured, p), ROOT)
                                                for p in args.without]
        runs += [(f"gateway before ({before})", measured, before.resolve()) for before in args.before]
        counted = {}
        for label, config, root in runs:
            ours = counted[label] = per_request("gateway", config, path, AUTH, args.requests, args.connections,
                                                Path(tmp), root)
            print(f"{label + ':':<36}{ours:9,.0f} instructions per request   predicted ratio {bare / ours:.2f}")
        if args.library_frame:
            frame = per_request("benchmarks.library_frame", measured, path, AUTH, args.requests, args.connections,
                                Path(tmp))
            print(f"{'library frame:':<36}{frame:9,.0f} instructions per request   "
                  f"gateway / library frame {counted['gateway'] / frame:.3f}")
            ours, frame = (per_request(module, measured, LIST_PATH, AUTH, args.requests, args.connections, Path(tmp))
                           for module in ("gateway", "benchmarks.library_frame"))
            print(f"{'gateway, list call:':<36}{ours:9,.0f} instructions per request")
            print(f"{'library frame, list call:':<36}{frame:9,.0f} instructions per request   "
                  f"gateway / library frame {ours / frame:.3f}")
        if args.aiohttp_client:
            client_cost(measured, args.requests, args.connections, Path(tmp))


if __name__ == "__main__":
    main()
