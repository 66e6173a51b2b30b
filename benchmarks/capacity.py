"""Capacity on paper: Redis commands and bytes per submit, per poll (miss and hit) and per task
completion, and S3 requests per task, measured on a private redis-server and moto server.

One gateway and one backend (Redis mode, `s3://` result store). The backend has one worker,
held by a slow task while the submissions are measured, so submitting and completing are
counted apart. Idle traffic (workers blocking on the stream, the callback poller) is measured
first and subtracted by time. Commands and bytes come from INFO commandstats and INFO stats;
S3 requests from the moto server's request log.

With `--cluster` the same runs on a Redis Cluster of three nodes, and each phase also
reports the busiest node's share of its commands: a cluster's capacity is that node's.

    python -m benchmarks.capacity [--tasks 50] [--cluster]
"""
from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.harness import AUTH, Processes
from tests.conftest import backend_config, gateway_config, synthetic_type
from tests.procs import RedisClusterServers, RedisServer, S3Server, Service, backend_headers, wait_until

API = "/api/v1/exports"


class RedisMeter:
    """Commands and bytes of one server, or of every node of a cluster (`busiest` then names the most loaded)."""

    def __init__(self, ports: list[int]) -> None:
        self.clients = [redis.Redis(port=port) for port in ports]
        self.busiest: list[float] = []  # per measure(): the busiest node's share of the commands

    def node(self, client: redis.Redis) -> tuple[Counter[str], int]:
        stats: dict[str, Any] = client.info("commandstats")
        calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
        net: dict[str, Any] = client.info("stats")
        # the meter's own INFO calls are a constant few per sample; they are left out below
        calls["info"] = 0
        return calls, int(net["total_net_input_bytes"]) + int(net["total_net_output_bytes"])

    def sample(self) -> list[tuple[Counter[str], int]]:
        return [self.node(client) for client in self.clients]


def measure(meter: RedisMeter, action: Callable[[], object]) -> tuple[Counter[str], int, float]:
    before = meter.sample()
    start = time.monotonic()
    action()
    elapsed = time.monotonic() - start
    calls, nbytes, per_node = Counter[str](), 0, []
    for (calls0, bytes0), (calls1, bytes1) in zip(before, meter.sample(), strict=True):
        calls1.subtract(calls0)
        calls.update(+calls1)
        per_node.append(sum((+calls1).values()))
        nbytes += bytes1 - bytes0
    meter.busiest.append(max(per_node) / max(1, sum(per_node)))
    return calls, nbytes, elapsed


def per(calls: Counter[str], nbytes: int, elapsed: float, idle: tuple[Counter[str], int, float], n: int
        ) -> tuple[float, float, dict[str, float]]:
    idle_calls, idle_bytes, idle_sec = idle
    share = elapsed / idle_sec
    net = {k: (calls[k] - idle_calls[k] * share) / n for k in calls}
    net = {k: round(v, 2) for k, v in net.items() if v > 0.05}
    return round(sum(net.values()), 1), round((nbytes - idle_bytes * share) / n), net


def s3_requests(log: Path) -> Counter[str]:
    """Requests on objects, by method (a delete is obstore's `POST ?delete`); bucket listings left out."""
    # werkzeug colours some lines (206 answers) with terminal escapes
    text = re.sub(r"\x1b\[[\d;]*m", "", log.read_text())
    return Counter(" ".join(m.groups()) for m in re.finditer(r'"(GET|PUT|POST|DELETE|HEAD) /exports(/results|\?delete)',
                                                             text))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--cluster", action="store_true", help="a Redis Cluster of three nodes instead of one server")
    args = parser.parse_args()
    n = args.tasks
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server: RedisServer | RedisClusterServers = RedisClusterServers(work) if args.cluster else RedisServer(work)
        server.start()
        ports = server.ports if isinstance(server, RedisClusterServers) else [server.port]
        s3 = S3Server(work).start()
        procs = Processes(work)
        try:
            config = backend_config(work / "b", server.url, result_store=f"s3://{s3.bucket}/results", workers=1,
                                    progress_interval_sec=30.0, task_ttl_sec=45, sweep_interval_sec=1.0)
            config["export_types"]["hold"] = synthetic_type("orders", 1000, fault={"delay_sec": 600})
            backend = Service("backend_stub", config, work, "backend", env=s3.env).start()
            procs.started.append(backend)
            gateway = procs.start("gateway", gateway_config(work / "g", backend.url, server.url), "gateway")
            client = httpx.Client(base_url=gateway.url, headers=AUTH, timeout=10)
            meter = RedisMeter(ports)
            idle = measure(meter, lambda: time.sleep(5))
            hold = client.post(API, json={"export_type": "hold"}).json()["data"]["task_id"]
            wait_until(lambda: client.get(f"{API}/{hold}").json()["data"]["status"] == "RUNNING", 20)
            ids: list[str] = []
            submit = measure(meter, lambda: ids.extend(
                client.post(API, json={"export_type": "report_export"}).json()["data"]["task_id"] for _ in range(n)))

            def complete() -> None:
                httpx.post(f"{backend.url}/exports/{hold}/cancel", headers=backend_headers("demo"), timeout=10)
                wait_until(lambda: all(httpx.get(f"{backend.url}/exports/{i}", headers=backend_headers("demo")).json()
                                       ["data"]["status"] == "COMPLETED" for i in ids[-1:]), 60, interval=0.2)
            done = measure(meter, complete)  # includes the wait's own reads of one task, every 0.2 s
            miss = measure(meter, lambda: [client.get(f"{API}/{i}") for i in ids])
            hit = measure(meter, lambda: [client.get(f"{API}/{i}") for i in ids])
            answers = [client.get(f"{API}/{i}").json()["data"] for i in ids]
            assert all(a["status"] == "COMPLETED" for a in answers), [a["status"] for a in answers]
            links = [a["result"]["download_url"] for a in answers]
            for link in links:
                assert httpx.get(link, timeout=10).status_code == 200
            wait_until(lambda: not s3.object_keys(), 150, interval=0.5, what="expiry to delete every object")
            total = s3_requests(s3.log_path)
            print(f"tasks: {n}; idle traffic: {sum(idle[0].values()) / idle[2]:.1f} commands/s")
            phases = (("submit", submit), ("completion", done), ("poll miss", miss), ("poll hit", hit))
            for (name, figures), busiest in zip(phases, meter.busiest[1:], strict=True):
                commands, nbytes, detail = per(*figures, idle=idle, n=n)
                shares = f"  busiest node {busiest:.0%}" if len(ports) > 1 else ""
                print(f"{name:10} {commands:6} commands  {nbytes:7} bytes{shares}   {detail}")
            print("S3 requests per task (store, one download, expiry):", {k: round(v / n, 2) for k, v in total.items()})
        finally:
            procs.stop_all()
            s3.stop()
            server.stop()


if __name__ == "__main__":
    main()
