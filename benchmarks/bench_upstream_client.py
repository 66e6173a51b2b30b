"""Choosing the upstream client: the same minimal proxy built on aiohttp, on httpx and on the gateway's own
client (gateway/http_client.py), same upstream.

The upstream is the bare Starlette app (fast), so the proxy's client is what differs.
Run: python -m benchmarks.bench_upstream_client [--seconds 8]
(`python -m benchmarks.bench_upstream_client run --config FILE` serves the proxy on the gateway's client.)
"""
from __future__ import annotations

import argparse
from typing import Any

import uvicorn
import yaml

from benchmarks import wrk
from benchmarks.harness import processes

KINDS = ("aiohttp_proxy", "httpx_proxy", "http_client_proxy")


def http_client_proxy(upstream: str) -> Any:
    """benchmarks/reference_servers.py's aiohttp_proxy, with the gateway's HttpClient in aiohttp's place."""
    from gateway.http_client import HttpClient
    from gateway.upstream import Timeouts

    state: dict[str, HttpClient] = {}
    timeouts = Timeouts()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            state["c"] = HttpClient(200)
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await state["c"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k != b"host"]
        query = scope["query_string"].decode()
        url = upstream + scope["path"] + (f"?{query}" if query else "")
        resp = await state["c"].request("GET", url, headers, None, timeouts)
        body = await resp.read()
        out = [(b"content-type", (resp.header("content-type") or "application/json").encode())]
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        await send({"type": "http.response.body", "body": body})

    return app


def serve(config_path: str) -> None:
    config = yaml.safe_load(open(config_path))
    uvicorn.run(http_client_proxy(config["upstream"]), host="127.0.0.1", port=config["port"], log_level="warning",
                access_log=False, loop="uvloop", http="httptools")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", nargs="?", choices=["run"])
    parser.add_argument("--config")
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    if args.command == "run":
        serve(args.config)
        return
    with processes() as procs:
        body = procs.workdir / "body.json"
        body.write_bytes(b'{"code":0,"message":"success","data":{"status":"RUNNING","progress":42}}')
        upstream = procs.start("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body)}, "upstream")
        results = {}
        for kind in KINDS:
            module = "bench_upstream_client" if kind == "http_client_proxy" else "reference_servers"
            proxy = procs.start(f"benchmarks.{module}", {"kind": kind, "upstream": upstream.url}, kind)
            wrk.run(f"{proxy.url}/x", seconds=1)
            results[kind] = wrk.run(f"{proxy.url}/x", seconds=args.seconds)
            proxy.stop()
        for kind, result in results.items():
            print(f"{kind:18s} {result.line()}")
        print(f"aiohttp / httpx: {results['aiohttp_proxy'].rps / results['httpx_proxy'].rps:.2f}x")
        print(f"gateway's client / aiohttp: {results['http_client_proxy'].rps / results['aiohttp_proxy'].rps:.2f}x")


if __name__ == "__main__":
    main()
