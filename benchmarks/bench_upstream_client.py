"""Choosing the upstream client: the same minimal proxy built on aiohttp and on httpx, same upstream.

The upstream is the bare Starlette app (fast), so the proxy's client is what differs.
Run: python -m benchmarks.bench_upstream_client [--seconds 8]
"""
from __future__ import annotations

import argparse

from benchmarks import wrk
from benchmarks.harness import processes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    with processes() as procs:
        body = procs.workdir / "body.json"
        body.write_bytes(b'{"code":0,"message":"success","data":{"status":"RUNNING","progress":42}}')
        upstream = procs.start("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body)}, "upstream")
        results = {}
        for kind in ("aiohttp_proxy", "httpx_proxy"):
            proxy = procs.start("benchmarks.reference_servers", {"kind": kind, "upstream": upstream.url}, kind)
            wrk.run(f"{proxy.url}/x", seconds=1)
            results[kind] = wrk.run(f"{proxy.url}/x", seconds=args.seconds)
            proxy.stop()
        for kind, result in results.items():
            print(f"{kind:14s} {result.line()}")
        print(f"aiohttp / httpx: {results['aiohttp_proxy'].rps / results['httpx_proxy'].rps:.2f}x")


if __name__ == "__main__":
    main()
