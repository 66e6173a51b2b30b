"""Event streams at scale: 5 tenants x 1,000 watchers over 50 tasks on one gateway process.

    python -m benchmarks.bench_push            # both modes: the backend's change feed, then shared pollers
    python -m benchmarks.bench_push --mode feed

One backend (SQLite, 10 workers) and one gateway process (`max_connections` 8,192, open files
raised to 65,536), on this machine. Ten tasks of a sixth tenant hold every worker (an export
that never finishes by itself), so the 50 watched tasks (10 per tenant) wait PENDING while the
watchers connect; then the holders are cancelled and the 50 run, ten at a time.

The load client is one asyncio process on raw sockets (this module, `client`), its CPU time
reported apart. It opens the 5,000 streams 1,000 at a time (the gateway's RSS read after each
step), holds them through a quiet phase (the gateway's CPU share with no watched task changing),
then takes every event of the active phase: for each backend change (an event id), the time from
the change (the task's `updated_at`, stamped by the backend) to the moment its last watcher
received it. The backend's request count comes from its /healthz counter.

The polling reference: the same 5,000 clients waiting through the SDK's own scheduler
(exports_client.polling.PollPlan, honouring the gateway's Retry-After: 1 s doubling with the
task's age to 30 s) over the same task ages, on a simulated clock; every poll of a task still
running reaches the backend (the status cache keeps only terminal answers).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from exports_client.models import Task
from exports_client.polling import PollPlan
from gateway.plugins.status_cache import poll_interval
from gateway.tenants import hash_key
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import Service, backend_headers, wait_until

TENANTS = [f"t{i}" for i in range(5)]
KEYS = {t: f"bench-key-{t}-0123456789" for t in [*TENANTS, "holder"]}
TASKS_PER_TENANT = 10
WATCHERS_PER_TENANT = 1000
STEP = 1000
WORKERS = 10
TASK_SEC = 6.0
IDLE_SEC = 20.0
NOFILE = 65536
_UPDATED = re.compile(rb'"updated_at":"([^"]+)"')
_ID = re.compile(rb"\nid: ([^\n]+)\n")


def raise_open_files() -> int:
    """Open files up to 65,536 (the goal's `ulimit -n`), or the hard limit where it is lower (a container)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_requests(backend: Service) -> int:
    return int(httpx.get(f"{backend.url}/healthz").json()["data"]["requests"])


# -- the load client (its own process) ---------------------------------------------------------------

class Watcher(asyncio.Protocol):
    def __init__(self, client: LoadClient) -> None:
        self.client = client
        self.rest = b""
        self.opened = asyncio.get_running_loop().create_future()  # its opening state came
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        now = time.time()
        *events, self.rest = (self.rest + data).split(b"\n\n")
        if events and not self.opened.done():
            self.opened.set_result(None)
        for event in events:
            self.client.seen(event, now)
            if b'"status":"COMPLETED"' in event and not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.done):
            if not future.done():
                future.set_result(None)


class LoadClient:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.since = float("inf")  # events of changes before this (the opening states) are not timed
        self.latest: dict[bytes, float] = {}  # event id -> latest receipt - change time
        self.receipts: dict[bytes, int] = {}
        self.refused = 0
        self._when: dict[bytes, float] = {}

    def seen(self, event: bytes, now: float) -> None:
        found = _ID.search(event)
        if found is None:
            return
        event_id = found.group(1)
        at = self._when.get(event_id)
        if at is None:
            stamp = _UPDATED.search(event)
            if stamp is None:
                return
            at = self._when[event_id] = datetime.fromisoformat(stamp.group(1).decode().replace("Z", "+00:00")) \
                .timestamp()
        if at < self.since:
            return
        self.latest[event_id] = max(self.latest.get(event_id, 0.0), now - at)
        self.receipts[event_id] = self.receipts.get(event_id, 0) + 1

    async def open(self, task_id: str, key: str) -> Watcher:
        transport, watcher = await asyncio.get_running_loop().create_connection(
            lambda: Watcher(self), self.host, self.port)
        transport.write(f"GET /api/v1/exports/{task_id}/events HTTP/1.1\r\nHost: {self.host}\r\n"
                        f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode())
        return watcher


async def run_client(spec: dict[str, Any]) -> None:
    client = LoadClient(spec["host"], spec["port"])
    watchers: list[Watcher] = []
    per_tenant, step = spec["watchers_per_tenant"], spec["step"]
    plan = [(tasks[i % len(tasks)], KEYS[tenant]) for tenant, tasks in spec["tasks"].items() for i in range(per_tenant)]
    random.Random(7).shuffle(plan)
    gate = asyncio.Semaphore(200)

    async def one(task_id: str, key: str) -> None:
        async with gate:
            watchers.append(await client.open(task_id, key))

    for start in range(0, len(plan), step):
        await asyncio.gather(*(one(t, k) for t, k in plan[start:start + step]))
        await asyncio.wait([w.opened for w in watchers], timeout=120)  # every opening state answered
        await asyncio.sleep(1.0)
        print(json.dumps({"opened": len(watchers)}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # the parent read the RSS
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go <since>"
    client.since = float(line.split()[1])
    done = [w.done for w in watchers]
    await asyncio.wait(done, timeout=spec["timeout"])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lags = sorted(client.latest.values())
    print(json.dumps({
        "finished": sum(1 for d in done if d.done()), "changes": len(lags),
        "p50_ms": 1000 * statistics.median(lags) if lags else None,
        "p99_ms": 1000 * lags[int(0.99 * (len(lags) - 1))] if lags else None,
        "max_ms": 1000 * lags[-1] if lags else None,
        "events": sum(client.receipts.values()), "cpu_sec": usage.ru_utime + usage.ru_stime,
    }), flush=True)


# -- the run ----------------------------------------------------------------------------------------

def polling_reference(clients: int, waited_sec: float, window_sec: float) -> float:
    """Backend requests per minute from `clients` polling through the SDK's scheduler in a window of
    `window_sec` that starts `waited_sec` after they began waiting (on tasks submitted just before)."""
    rng = random.Random(11)
    task = Task(task_id="t", status="RUNNING")
    polls = 0
    for _ in range(clients):
        plan, now = PollPlan("t", float("inf"), rng), 0.0
        while now < waited_sec + window_sec:
            polls += now >= waited_sec
            plan.answered(now, task, poll_interval(now, 1, 30))
            now = plan.not_before
    return polls / (window_sec / 60)


def run(mode: str, workdir: Path, per_tenant: int) -> dict[str, Any]:
    backend_conf = backend_config(workdir, workers=WORKERS, change_log={"feed": mode == "feed"})
    backend_conf["export_types"]["hold_export"] = {"dataset": "orders", "rows": 1000, "seed": 1,
                                                   "fault": {"delay_sec": 3600}}
    backend_conf["export_types"]["watched_export"] = {"dataset": "orders", "rows": 1000, "seed": 2,
                                                      "fault": {"delay_sec": TASK_SEC}}
    backend = Service("backend_stub", backend_conf, workdir, f"backend-{mode}").start()
    gw = gateway_config(workdir, backend.url, connection_limits={"max_connections": 8192})
    gw["tenants"] = {t: {"api_key_hashes": [hash_key(k)]} for t, k in KEYS.items()}
    env = {**RAISED_LIMITS, "TENANT_MAX_OPEN_STREAMS": "100000"}
    gateway = Service("gateway", gw, workdir, f"gateway-{mode}", env=env).start()
    client: subprocess.Popen[str] | None = None
    try:
        def submit(tenant: str, export_type: str) -> str:
            resp = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": export_type},
                              headers={"Authorization": f"Bearer {KEYS[tenant]}"})
            return str(resp.json()["data"]["task_id"])

        holders = [submit("holder", "hold_export") for _ in range(WORKERS)]
        as_holder = backend_headers("holder")
        wait_until(lambda: all(httpx.get(f"{backend.url}/exports/{h}", headers=as_holder).json()["data"]["status"]
                               == "RUNNING" for h in holders), 30, what="the holders to take every worker")
        submitted = time.time()
        tasks = {t: [submit(t, "watched_export") for _ in range(TASKS_PER_TENANT)] for t in TENANTS}
        assert gateway.proc is not None
        pid = gateway.proc.pid
        rss = [gateway.rss_bytes()]
        spec = {"host": "127.0.0.1", "port": gateway.port, "tasks": tasks, "timeout": 300,
                "watchers_per_tenant": per_tenant, "step": min(STEP, per_tenant * len(TENANTS))}
        client = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_push", "client", json.dumps(spec)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdin is not None and client.stdout is not None
        opened, opening_started = 0, backend_requests(backend)
        while opened < per_tenant * len(TENANTS):
            opened = json.loads(client.stdout.readline())["opened"]
            rss.append(gateway.rss_bytes())
            client.stdin.write("\n")
            client.stdin.flush()
        requests_before, cpu_before = backend_requests(backend), cpu_seconds(pid)
        opening_requests = requests_before - opening_started
        time.sleep(IDLE_SEC)
        idle_cpu = (cpu_seconds(pid) - cpu_before) / IDLE_SEC
        idle_requests = backend_requests(backend) - requests_before
        since = time.time()
        client.stdin.write(f"go {since}\n")
        client.stdin.flush()
        requests_before, cpu_before = backend_requests(backend), cpu_seconds(pid)
        for holder in holders:
            httpx.post(f"{backend.url}/exports/{holder}/cancel", headers=backend_headers("holder"))
        result = json.loads(client.stdout.readline())
        active_sec = time.time() - since
        result.update(
            mode=mode, rss_mib=[round(r / 2**20, 1) for r in rss],
            rss_per_1000_mib=round((rss[-1] - rss[0]) / 2**20 / (opened / 1000), 1),
            # the first step also pays for what the first stream loads once (modules, the hub, the feed)
            rss_per_1000_after_first_mib=round((rss[-1] - rss[1]) / 2**20 / (opened / 1000 - 1), 1)
            if opened >= 2000 else None,
            idle_cpu_share=round(idle_cpu, 4), idle_backend_requests=idle_requests,
            active_sec=round(active_sec, 1), active_cpu_share=round((cpu_seconds(pid) - cpu_before) / active_sec, 3),
            backend_requests_per_min=round((backend_requests(backend) - requests_before - len(holders))
                                           / (active_sec / 60)),
            opening_backend_requests=opening_requests,
            polling_requests_per_min=round(polling_reference(opened, since - submitted, active_sec)),
        )
        return result
    finally:
        if client is not None:
            client.kill()
        gateway.stop()
        backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", nargs="?", default="run", choices=["run", "client"])
    parser.add_argument("spec", nargs="?")
    parser.add_argument("--mode", choices=["feed", "poll", "both"], default="both")
    parser.add_argument("--watchers-per-tenant", type=int, default=WATCHERS_PER_TENANT)
    args = parser.parse_args()
    open_files = raise_open_files()
    if args.role == "client":
        asyncio.run(run_client(json.loads(args.spec)))
        return
    print(f"open files: {open_files}; load average before: {os.getloadavg()}", flush=True)
    for mode in (["feed", "poll"] if args.mode == "both" else [args.mode]):
        with tempfile.TemporaryDirectory(prefix=f"bench-push-{mode}-") as tmp:
            print(json.dumps(run(mode, Path(tmp), args.watchers_per_tenant)), flush=True)
        print(f"load average after {mode}: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
