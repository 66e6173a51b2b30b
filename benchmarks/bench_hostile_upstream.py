"""Hostile upstream (issue 29): the gateway's RSS while clients ask, again and again, for an answer a plugin
reads whole and the upstream never ends (tests/hostile_upstream.py's `/endless`).

Each request must end quickly with 502 (`answer_too_large`) at the route's `max_answer_bytes`, left at its
default (4 MiB); before the bound, the issue measured 71 MB growing to 6.6 GB in 20 s.

Run: python -m benchmarks.bench_hostile_upstream [--seconds 20] [--clients 4]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import time

import httpx

from benchmarks.harness import processes
from tests.conftest import DEMO_KEY, gateway_config

ROUTE = {"name": "signed", "path": "/h/{p:path}", "methods": ["GET"], "upstream": "hostile", "rewrite": "/{p}",
         "plugins": ["auth", {"signed_download": {"action": "sign"}}],
         "policy": {"timeout": {"connect": 2, "read": 5, "total": 10}}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with processes() as procs:
        hostile = procs.start("tests.hostile_upstream", {}, "hostile")
        config = gateway_config(procs.workdir, hostile.url)
        config["upstreams"]["exports"]["change_feed"] = None
        config["upstreams"]["hostile"] = {"url": hostile.url, "change_feed": None}
        config["routes"].append(ROUTE)
        gateway = procs.start("gateway", config, "gateway")
        start_rss = peak = gateway.rss_bytes()
        statuses: collections.Counter[int] = collections.Counter()
        slowest = 0.0

        def one() -> tuple[int, float]:
            began = time.monotonic()
            resp = httpx.get(f"{gateway.url}/h/endless", headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=60)
            return resp.status_code, time.monotonic() - began

        end = time.monotonic() + args.seconds
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            while time.monotonic() < end:
                for status, took in pool.map(lambda _: one(), range(args.clients)):
                    statuses[status] += 1
                    slowest = max(slowest, took)
                peak = max(peak, gateway.rss_bytes())
        print(f"{sum(statuses.values())} requests in {args.seconds:g} s, statuses {dict(statuses)}, slowest "
              f"{slowest:.2f} s; gateway RSS {start_rss / 2**20:.0f} MiB at the start, peak {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
