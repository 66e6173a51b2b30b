"""Chaos as a tool: gateways, backends and Redis as real processes, a retrying client, and faults.

Each scenario starts a fresh stack, submits at a steady rate for a while, injects its
fault, and then polls every task id the client obtained until it is terminal. Stacks:
- the pair: gateway A → backend 1, gateway B → backend 2, both backends sharing one result
  directory, everything on one Redis with an append-only file (the older scenarios);
- `make cluster` itself (`python -m scripts.run_cluster up`, on shifted ports): nginx in front of two
  gateways balancing over two backends, Redis, moto as the S3 result store, every node
  supervised; every submission carries a callback to a slow receiver here (1.5 s an answer,
  slower than the backends' polls), so duplicated and lost callbacks are counted too;
- the pair on a Redis Cluster of 3 primaries with a replica each (`redis_failover`);
- the pair with the backends' task store on a PostgreSQL of the scenario's own (initdb and a
  server on a free port in a temporary directory, never the machine's; the gateways stay on Redis).
The client does what a careful client does: it retries a submission with the same
Idempotency-Key (after Retry-After, through any entry point) until it gets an id, for up
to 90 s.

Scenarios of the cluster (issue 21's findings 1-6): `node_deaths` (kill -9 of b1, then g2,
then Redis: each restarted by the supervisor), `slow_callbacks` (no fault: the slow receiver
alone), `s3_outage` (moto frozen 15 s), `redis_failover` (the store's primary killed),
`gateway_freeze` (g1 frozen 20 s behind nginx), `disk_full` (b1's data_dir, a 32 MiB tmpfs,
filled to 2 MiB free with min_free_bytes 1 MiB, while user exports of about 2.9 MB run
between report exports; space back 15 s later; needs root for the mount).

Scenarios of the store on PostgreSQL (issue 24): `db_restart` (a clean stop, started again 5 s
later), `db_kill` (kill -9 of every server process, started again 3 s later: crash recovery),
`db_stall` (SIGSTOP of every server process for 6 s, less than the lease). In each, while the
database is down, every backend's /readyz must answer 503 with Retry-After ("readyz 503"
column); no worker dies, so no task may run twice.

Per scenario it prints: submitted; ids obtained; completed; lost (an id the client
held that never completed, or went 404); duplicated (one key answered with two
ids, or one task started twice although no process running it died); re-run
after a kill (a task started again because the backend process running it was
killed: allowed, and each such task runs exactly twice); 500s (any
5xx other than a 503 with Retry-After: the answers that are bugs); 503s with
Retry-After (the designed answer while a dependency is down); recovery (seconds
from the end of the fault to the last failed client call); and on the cluster, callbacks
lost (a completed task whose callback never came) and duplicated (a notification that
arrived twice, beyond those a backend took over after another died mid-delivery, which
at-least-once allows: shown in the note).

    python -m benchmarks.chaos                      # every scenario (a quarter of an hour)
    python -m benchmarks.chaos redis_stall backend_kill --rate 4 --seconds 8
    python -m benchmarks.chaos node_deaths gateway_freeze
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import contextvars
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from exports_common.dev_mode import DEMO_API_KEYS
from tests.cluster_run import RunningCluster
from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.databases import PostgresInstance, server_home
from tests.procs import RedisClusterServers, RedisServer, Service
from tests.receiver import Receiver

API = "/api/v1/exports"
EXPORT_TYPE = "chaos_export"
# ~1.5 s per task: long enough that faults land on running exports
EXPORT_TYPES = {EXPORT_TYPE: synthetic_type("orders", 5000, 11, fault={"delay_sec": 1.5})}
LEASE_SEC = 15.0  # longer than the 10 s Redis stall: that stall must not run any task twice
GIVE_UP_SEC = 90.0
# the limiter (once it exists) still runs; a chaos client must not be rate limited
LIMITS_ENV = {"TENANT_REQUESTS_PER_SEC": "10000", "TENANT_REQUESTS_BURST": "20000",
              "TENANT_SUBMITS_PER_SEC": "10000", "TENANT_SUBMITS_BURST": "20000", "TENANT_MAX_ACTIVE_TASKS": "100000"}
RECEIVER_DELAY_SEC = 1.5  # slower than the backends' 0.2 s poll for due callbacks
# the disk scenario: b1 left 2 MiB (min_free_bytes 1 MiB) while user exports (about 2.9 MB each) and report
# exports (about 0.7 MB) alternate: the first user export b1 takes fills its disk
DISK_BYTES, DISK_MIN_FREE, DISK_LEFT = 32 << 20, 1 << 20, 2 << 20
DB_STALL_SEC = 6.0  # well under LEASE_SEC: a stall shorter than the lease must run no task twice
# a request waits this long for a pooled connection on a stalled database before its 503
DB_POOL_TIMEOUT_SEC = 1.0
READYZ_WAIT_SEC = 20.0  # for every backend's /readyz to say 503 once the database is down


class AnyStack(Protocol):
    """What a scenario and the client need of a stack."""

    killed: set[tuple[int, int]]  # (backend index, incarnation) of every backend process that was killed
    receiver: Receiver | None
    readyz_503: bool | None  # the database scenarios: every backend's /readyz said 503 while it was down

    def entry_points(self) -> list[str]: ...

    def auth(self) -> dict[str, str]: ...

    def body(self) -> dict[str, Any]: ...

    def backend_logs(self) -> list[str]: ...


class Stack:
    """Two gateways, two backends, one Redis (or a Redis Cluster with replicas); faults by name.

    With `postgres`, the backends' task store is a PostgreSQL of the stack's own (the gateways stay on Redis).
    """

    def __init__(self, workdir: Path, redis_cluster: bool = False, postgres: bool = False) -> None:
        self.workdir = workdir
        (workdir / "redis").mkdir()
        self.redis = RedisServer(workdir / "redis", persistent=True)
        self.cluster = RedisClusterServers(workdir / "redis", size=3, replicas=1) if redis_cluster else None
        self.postgres = postgres
        self.database: PostgresInstance | None = None
        self.backends: list[Service] = []
        self.gateways: list[Service] = []
        self.killed: set[tuple[int, int]] = set()
        self.incarnation = [0, 0]
        self.receiver: Receiver | None = None
        self.readyz_503: bool | None = None  # the database scenarios: every /readyz said 503 while it was down

    def _store(self, redis_url: str) -> dict[str, Any]:
        """The backends' store settings: the stack's Redis, or its own PostgreSQL (started here)."""
        if not self.postgres:
            return {"redis_url": redis_url}
        # its files in a directory of its own (owned by the postgres user, which the server runs as)
        self.database = PostgresInstance(PostgresInstance.make_template(server_home("chaos-postgres"))).start()
        return {"redis_url": "", "database_url": self.database.url, "database_pool_timeout_sec": DB_POOL_TIMEOUT_SEC}

    def start(self) -> Stack:
        url = self.cluster.start().url if self.cluster is not None else self.redis.start().url
        store = self._store(url)
        shared = self.workdir / "results"  # both backends serve each other's files
        for i in range(2):
            config = backend_config(self.workdir, data_dir=str(shared), workers=4,
                                    lease_sec=LEASE_SEC, progress_interval_sec=0.2, export_types=EXPORT_TYPES,
                                    log_level="info", **store)
            self.backends.append(Service("backend_stub", config, self.workdir, f"backend-{i + 1}").start(timeout=60))
        for i, backend in enumerate(self.backends):
            config = gateway_config(self.workdir, backend.url, url, access_log=True)  # for a failed run's trace
            self.gateways.append(Service("gateway", config, self.workdir, f"gateway-{'AB'[i]}",
                                         env=LIMITS_ENV).start(timeout=60))
        return self

    def stop(self) -> None:
        for service in [*self.gateways, *self.backends]:
            service.stop()
        if self.cluster is not None:
            self.cluster.stop()
        self.redis.stop()
        if self.database is not None:
            self.database.stop()
            # the server's log lives with its files (in memory): kept with the stack's other logs
            shutil.copy(self.database.log_path, self.workdir / "postgresql.log")
            self.database.remove()

    def entry_points(self) -> list[str]:
        return [gateway.url for gateway in self.gateways]

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {DEMO_KEY}"}

    def body(self) -> dict[str, Any]:
        return {"export_type": EXPORT_TYPE, "format": "csv"}

    def backend_logs(self) -> list[str]:
        return [backend.log() for backend in self.backends]

    def kill_backend(self, i: int) -> None:
        self.backends[i].kill()
        self.killed.add((i, self.incarnation[i]))

    def restart_backend(self, i: int) -> None:
        self.incarnation[i] += 1
        self.backends[i].start(timeout=60)  # a loaded two-core machine starts Python slowly

    def check_readyz_down(self) -> None:
        """Whether every backend's /readyz answers 503 with Retry-After (within READYZ_WAIT_SEC), the database
        being down; noted in `readyz_503` (False if any was seen ready throughout)."""
        def unready(backend: Service) -> bool:
            try:
                resp = httpx.get(f"{backend.url}/readyz", timeout=READYZ_WAIT_SEC)
            except httpx.HTTPError:
                return False
            return resp.status_code == 503 and "retry-after" in resp.headers

        deadline = time.monotonic() + READYZ_WAIT_SEC
        pending = list(self.backends)
        while pending and time.monotonic() < deadline:
            pending = [backend for backend in pending if not unready(backend)]
            if pending:
                time.sleep(0.2)
        self.readyz_503 = not pending


class ClusterStack:
    """`make cluster` itself; its backends' data dirs optionally on small tmpfs mounts (the disk scenario)."""

    def __init__(self, workdir: Path, small_disk: bool = False) -> None:
        self.workdir = workdir
        self.small_disk = small_disk
        env = {"BACKEND_MIN_FREE_BYTES": str(DISK_MIN_FREE)} if small_disk else {}
        self.cluster = RunningCluster(workdir, env=env)
        self.receiver: Receiver | None = Receiver(delay_sec=RECEIVER_DELAY_SEC)
        self.killed: set[tuple[int, int]] = set()
        self.readyz_503: bool | None = None  # no database scenario runs on it
        self.bodies = 0

    def start(self) -> ClusterStack:
        if self.small_disk:
            mount = self.workdir / "b1"
            mount.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)], check=True)
        assert self.receiver is not None
        self.receiver.__enter__()
        self.cluster.start()
        return self

    def stop(self) -> None:
        self.cluster.stop()
        if self.receiver is not None:
            self.receiver.__exit__()
        if self.small_disk:
            subprocess.run(["umount", "--lazy", str(self.workdir / "b1")], check=False)

    def entry_points(self) -> list[str]:
        return [self.cluster.lb]

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {DEMO_API_KEYS['demo']}"}

    def body(self) -> dict[str, Any]:
        assert self.receiver is not None
        self.bodies += 1
        export_type = "user_export" if self.small_disk and self.bodies % 2 else "report_export"
        return {"export_type": export_type, "callback_url": self.receiver.url}

    def backend_logs(self) -> list[str]:
        return [self.cluster.log("b1"), self.cluster.log("b2")]

    def kill(self, name: str) -> None:
        if name in ("b1", "b2"):
            incarnation = self.cluster.log(name).count("Started server process") - 1
            self.killed.add((int(name[1]) - 1, incarnation))
        self.cluster.signal(name, signal.SIGKILL)

    def fill_disk(self, leave: int) -> None:
        disk = self.workdir / "b1"
        stat = os.statvfs(disk)
        with open(disk / "filler", "wb") as out:
            out.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))

    def free_disk(self) -> None:
        (self.workdir / "b1" / "filler").unlink(missing_ok=True)


@dataclass
class Tally:
    submitted: int = 0
    ids: dict[str, set[str]] = field(default_factory=dict)  # key → task ids answered
    submitted_at: dict[str, float] = field(default_factory=dict)
    completed: set[str] = field(default_factory=set)
    bad_5xx: int = 0
    unavailable: int = 0
    error_times: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)
    last_seen: dict[str, str] = field(default_factory=dict)  # task id → the last status (or answer) a poll got
    # every submit's answers and every poll's end, in order: written to the run's journal.jsonl
    journal: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, event: str, **fields: Any) -> None:
        self.journal.append({"t": round(time.monotonic() - self.started, 3), "at": round(time.time(), 3),
                             "event": event, **fields})


class Client:
    def __init__(self, stack: AnyStack, tally: Tally) -> None:
        self.stack = stack
        self.tally = tally
        self.http = httpx.AsyncClient(timeout=30.0, headers=stack.auth())

    def _gateway(self) -> str:
        return random.choice(self.stack.entry_points())

    def _failed(self, what: str) -> None:
        self.tally.error_times.append(time.monotonic())
        if len(self.tally.examples) < 8:
            self.tally.examples.append(what)

    def _classify(self, resp: httpx.Response, what: str) -> float:
        """Count a failed answer; the seconds to wait before trying again."""
        self._failed(f"{what} {resp.status_code} {resp.text[:120]}")
        if resp.status_code >= 500:
            if resp.status_code == 503 and "retry-after" in resp.headers:
                self.tally.unavailable += 1
            else:
                self.tally.bad_5xx += 1
        return min(2.0, float(resp.headers.get("retry-after", "0.5")))

    async def submit_and_follow(self, key: str, body: dict[str, Any]) -> None:
        """Submit, then poll what it got until terminal: polls run while the faults do."""
        await self.submit(key, body)
        deadline = time.monotonic() + GIVE_UP_SEC
        await asyncio.gather(*(self.wait_terminal(task_id, deadline) for task_id in self.tally.ids.get(key, ())))

    async def submit(self, key: str, body: dict[str, Any]) -> None:
        self.tally.submitted += 1
        self.tally.submitted_at[key] = time.monotonic()
        give_up = time.monotonic() + GIVE_UP_SEC
        while time.monotonic() < give_up:
            entry = self._gateway()
            try:
                resp = await self.http.post(entry + API, json=body, headers={"Idempotency-Key": key})
            except httpx.HTTPError as exc:
                self._failed(f"submit {type(exc).__name__}")
                self.tally.note("submit", key=key, entry=entry, error=type(exc).__name__)
                await asyncio.sleep(0.2)
                continue
            self._journal_submit(key, entry, resp)
            if resp.status_code == 202:
                self.tally.ids.setdefault(key, set()).add(resp.json()["data"]["task_id"])
                # ask again once more, through any entry point: a second id would be a duplicate
                if len(self.tally.ids[key]) == 1 and random.random() < 0.3:
                    await asyncio.sleep(0.5)
                    continue
                return
            await asyncio.sleep(self._classify(resp, "submit"))

    def _journal_submit(self, key: str, entry: str, resp: httpx.Response) -> None:
        """One submit answer: its status, task id, whether the outbox took it (degraded), request id, replay."""
        try:
            data = resp.json().get("data") or {}
        except ValueError:
            data = {}
        self.tally.note("submit", key=key, entry=entry, status=resp.status_code, task_id=data.get("task_id"),
                        degraded=bool(data.get("degraded")), request_id=resp.headers.get("x-request-id"),
                        replayed=resp.headers.get("idempotent-replayed") == "true",
                        error=None if resp.status_code < 400 else resp.text[:200])

    async def wait_terminal(self, task_id: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                resp = await self.http.get(f"{self._gateway()}{API}/{task_id}")
            except httpx.HTTPError as exc:
                self._failed(f"poll {type(exc).__name__}")
                await asyncio.sleep(0.5)
                continue
            self.tally.last_seen[task_id] = str(resp.status_code)
            if resp.status_code == 200:
                status = resp.json()["data"]["status"]
                self.tally.last_seen[task_id] = status
                if status == "COMPLETED":
                    self.tally.completed.add(task_id)
                    self.tally.note("poll end", task_id=task_id, status=status)
                    return
                if status in ("FAILED", "CANCELLED", "TIMEOUT"):
                    self.tally.note("poll end", task_id=task_id, status=status, body=resp.text[:300])
                    return
                await asyncio.sleep(1.0)
                continue
            if resp.status_code == 404:
                self.tally.note("poll end", task_id=task_id, status=404, entry=resp.request.url.host + ":" +
                                str(resp.request.url.port), request_id=resp.headers.get("x-request-id"),
                                body=resp.text[:300])
                return  # forgotten: counted as lost
            await asyncio.sleep(self._classify(resp, "poll"))


Fault = Callable[[Any], Coroutine[Any, Any, float]]  # injects; returns the monotonic time the fault ended


async def _later(seconds: float, action: Callable[[], object]) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(action)
    journal = _journal.get()
    if journal is not None:
        journal.note("fault", action=getattr(action, "__name__", repr(action)))


# the run in progress (set in its fault's task), whose journal notes the faults as they happen
_journal: contextvars.ContextVar[Tally | None] = contextvars.ContextVar("chaos_journal", default=None)


@dataclass(frozen=True)
class Scenario:
    fault: Fault
    stack: Callable[[Path], Any]  # makes the (not yet started) stack it runs on


def _scenarios(at: float) -> dict[str, Scenario]:
    async def baseline(stack: Stack) -> float:
        return time.monotonic()

    async def backend_kill(stack: Stack) -> float:
        await _later(at, lambda: stack.kill_backend(0))
        await _later(4, lambda: stack.restart_backend(0))
        return time.monotonic()

    async def gateway_kill(stack: Stack) -> float:
        await _later(at, stack.gateways[0].kill)
        await _later(4, lambda: stack.gateways[0].start(timeout=60))
        return time.monotonic()

    async def redis_stall(stack: Stack) -> float:
        await _later(at, stack.redis.pause)
        await _later(10, stack.redis.resume)
        return time.monotonic()

    async def redis_kill_aof(stack: Stack) -> float:
        await _later(at, stack.redis.kill)
        await _later(3, stack.redis.restart)
        return time.monotonic()

    async def redis_restart_empty(stack: Stack) -> float:
        await _later(at, functools.partial(stack.redis.restart, empty=True))
        return time.monotonic()

    async def backends_down(stack: Stack) -> float:
        def kill_both() -> None:
            stack.kill_backend(0)
            stack.kill_backend(1)

        await _later(at, kill_both)
        await _later(5, lambda: stack.restart_backend(0))  # only gateway A's backend returns at first
        end = time.monotonic()
        await _later(8, lambda: stack.restart_backend(1))
        return end

    async def db_down(stack: Stack, fault: Callable[[], object], seconds: float, back: Callable[[], object]
                      ) -> float:
        """`fault` at `at`, every /readyz checked meanwhile, `back` `seconds` after the fault (or once checked)."""
        await _later(at, fault)
        down = time.monotonic()
        await asyncio.to_thread(stack.check_readyz_down)
        await _later(max(0.0, seconds - (time.monotonic() - down)), back)
        return time.monotonic()

    async def db_restart(stack: Stack) -> float:
        assert stack.database is not None
        return await db_down(stack, stack.database.stop, 5, stack.database.start)

    async def db_kill(stack: Stack) -> float:
        assert stack.database is not None
        return await db_down(stack, stack.database.kill9, 3, stack.database.start)

    async def db_stall(stack: Stack) -> float:
        assert stack.database is not None
        return await db_down(stack, stack.database.pause, DB_STALL_SEC, stack.database.resume)

    async def redis_failover(stack: Stack) -> float:
        assert stack.cluster is not None
        primary = stack.cluster.owner("{exports}")
        await _later(at, lambda: stack.cluster.kill(primary) if stack.cluster else None)
        await asyncio.to_thread(stack.cluster.wait_failover, "{exports}", primary)
        return time.monotonic()

    async def node_deaths(stack: ClusterStack) -> float:
        await _later(at, lambda: stack.kill("b1"))
        await _later(3, lambda: stack.kill("g2"))
        await _later(3, lambda: stack.kill("redis"))
        await asyncio.to_thread(stack.cluster.wait_serving, "redis", 1)
        return time.monotonic()

    async def slow_callbacks(stack: ClusterStack) -> float:
        return time.monotonic()

    async def s3_outage(stack: ClusterStack) -> float:
        await _later(at, lambda: stack.cluster.signal("s3", signal.SIGSTOP))
        await _later(15, lambda: stack.cluster.signal("s3", signal.SIGCONT))
        return time.monotonic()

    async def gateway_freeze(stack: ClusterStack) -> float:
        await _later(at, lambda: stack.cluster.signal("g1", signal.SIGSTOP))
        await _later(20, lambda: stack.cluster.signal("g1", signal.SIGCONT))
        return time.monotonic()

    async def disk_full(stack: ClusterStack) -> float:
        await _later(at, lambda: stack.fill_disk(DISK_LEFT))
        await _later(15, stack.free_disk)
        return time.monotonic()

    pair, on_redis_cluster = Stack, functools.partial(Stack, redis_cluster=True)
    on_postgres = functools.partial(Stack, postgres=True)
    cluster, small_disk = ClusterStack, functools.partial(ClusterStack, small_disk=True)
    return {
        "baseline": Scenario(baseline, pair), "backend_kill": Scenario(backend_kill, pair),
        "gateway_kill": Scenario(gateway_kill, pair), "redis_stall": Scenario(redis_stall, pair),
        "redis_kill_aof": Scenario(redis_kill_aof, pair), "redis_restart_empty": Scenario(redis_restart_empty, pair),
        "backends_down": Scenario(backends_down, pair),
        "node_deaths": Scenario(node_deaths, cluster), "slow_callbacks": Scenario(slow_callbacks, cluster),
        "s3_outage": Scenario(s3_outage, cluster), "redis_failover": Scenario(redis_failover, on_redis_cluster),
        "gateway_freeze": Scenario(gateway_freeze, cluster), "disk_full": Scenario(disk_full, small_disk),
        "db_restart": Scenario(db_restart, on_postgres), "db_kill": Scenario(db_kill, on_postgres),
        "db_stall": Scenario(db_stall, on_postgres),
    }


SCENARIOS = tuple(_scenarios(0))


@dataclass(frozen=True)
class Outcome:
    scenario: str
    submitted: int
    obtained: int
    completed: int
    lost: int
    duplicated: int
    rerun_after_kill: int
    bad_5xx: int
    unavailable: int
    recovery_sec: float
    callbacks_lost: int | None = None
    callbacks_duplicated: int | None = None
    readyz_503: bool | None = None  # the database scenarios: every backend's /readyz said 503 while it was down
    note: str = ""

    def row(self) -> str:
        def shown(n: int | None) -> str:
            return "-" if n is None else str(n)

        return (f"| {self.scenario} | {self.submitted} | {self.obtained} | {self.completed} | {self.lost} | "
                f"{self.duplicated} | {self.rerun_after_kill} | {shown(self.callbacks_lost)} | "
                f"{shown(self.callbacks_duplicated)} | {self.bad_5xx} | {self.unavailable} | "
                f"{self.recovery_sec:.1f} | {self.note} |")


HEADER = ("| scenario | submitted | ids obtained | completed | lost | duplicated | re-run after a kill | "
          "callbacks lost | callbacks duplicated | 500s | 503 + Retry-After | recovery (s) | note |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


@contextlib.contextmanager
def running_stack(make: Callable[[Path], Any], workdir: Path) -> Iterator[Any]:
    stack = make(workdir)
    try:
        yield stack.start()
    finally:
        stack.stop()


async def _drive(stack: AnyStack, fault: Fault, rate: float, seconds: float) -> tuple[Tally, float]:
    tally = Tally()
    _journal.set(tally)
    client = Client(stack, tally)
    run = f"{time.time_ns():x}"
    submits = []
    fault_task = asyncio.create_task(fault(stack))
    for n in range(int(rate * seconds)):
        submits.append(asyncio.create_task(client.submit_and_follow(f"chaos-{run}-{n}", stack.body())))
        await asyncio.sleep(1 / rate)
    fault_end = await fault_task
    await asyncio.gather(*submits)
    await client.http.aclose()
    return tally, fault_end


def _callbacks(stack: AnyStack, completed: set[str]) -> tuple[int | None, int | None, str]:
    """(completed tasks whose callback never came, notifications repeated beyond takeovers, a note)."""
    if stack.receiver is None:
        return None, None, ""
    deadline = time.monotonic() + 60  # the last tasks' callbacks are on their way (each answer takes 1.5 s)
    while time.monotonic() < deadline:
        with stack.receiver.lock:
            arrived = {json.loads(r.body)["task_id"] for r in stack.receiver.received}
        if completed <= arrived:
            break
        time.sleep(0.5)
    with stack.receiver.lock:
        counts = collections.Counter(r.headers["webhook-id"] for r in stack.receiver.received)
    repeats = sum(n - 1 for n in counts.values())
    taken_over = sum(log.count("callback delivery taken over") for log in stack.backend_logs())
    note = f"{taken_over} callbacks taken over after a backend died mid-delivery" if taken_over else ""
    return len(completed - arrived), max(0, repeats - taken_over), note


def run_scenario(name: str, rate: float, seconds: float, fault_at: float) -> Outcome:
    scenario = _scenarios(fault_at)[name]
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
    try:
        return _run_in(name, scenario, workdir, rate, seconds)
    except BaseException:
        print(f"chaos: {name} broke off; its logs are kept in {workdir}", file=sys.stderr, flush=True)
        raise


def _run_in(name: str, scenario: Scenario, workdir: Path, rate: float, seconds: float) -> Outcome:
    with running_stack(scenario.stack, workdir) as stack:
        tally, fault_end = asyncio.run(_drive(stack, scenario.fault, rate, seconds))
        starts = _starts_by_process(stack.backend_logs())
        callbacks_lost, callbacks_duplicated, callback_note = _callbacks(stack, tally.completed)
        killed = stack.killed
        released = sum(log.count("the disk filled up under the export") for log in stack.backend_logs())
        readyz_503 = stack.readyz_503
    ids = {task_id for answered in tally.ids.values() for task_id in answered}
    notes = [callback_note] if callback_note else []
    considered = ids
    if name == "redis_restart_empty":
        # a Redis without its data has forgotten every task: only what was submitted after it counts
        considered = {t for key, answered in tally.ids.items() for t in answered
                      if tally.submitted_at[key] > fault_end}
        notes.append(f"{len(ids - considered)} ids from before the restart are gone with Redis's data; not counted")
    lost_ids = sorted(considered - tally.completed)
    lost = len(lost_ids)
    if lost_ids:  # what the client last saw of them: a status, or the HTTP status of the last answer
        notes.append("lost: " + ", ".join(f"{t} (last seen: {tally.last_seen.get(t, 'never polled')})"
                                         for t in lost_ids[:3]))
    two_ids = sum(1 for key, answered in tally.ids.items() if len(answered) > 1 and answered & considered)
    ran_twice = sum(1 for task_id, procs in starts.items()
                    if len(procs) > 1 and not any(p in killed for p in procs[:-1]))
    rerun_after_kill = sum(1 for procs in starts.values() if len(procs) > 1) - ran_twice
    if released:
        notes.append(f"{released} attempts given back to the queue by the full disk (started again elsewhere)")
        ran_twice = max(0, ran_twice - released)  # a released attempt starts again: allowed, not a duplicate
    suspects = [k for k, answered in tally.ids.items() if len(answered) > 1 and answered & considered][:2] + [
        t for t, procs in starts.items() if len(procs) > 1 and not any(p in killed for p in procs[:-1])][:2]
    if suspects and (two_ids or ran_twice):
        notes.append("duplicated: " + ", ".join(suspects))
    if readyz_503 is not None:
        notes.append("readyz 503 with Retry-After while down" if readyz_503 else "a /readyz said ready while down")
    errors_after = [t for t in tally.error_times if t > fault_end]
    recovery = max(errors_after) - fault_end if errors_after and name != "baseline" else 0.0
    failed = bool(lost or two_ids or ran_twice or tally.bad_5xx or readyz_503 is False
                  or len(tally.ids) < tally.submitted)
    if failed:
        notes.append(f"logs kept in {workdir}")
    _keep_or_remove(workdir, tally, failed)
    return Outcome(name, tally.submitted, len(tally.ids), len(considered & tally.completed), lost,
                   two_ids + ran_twice, rerun_after_kill, tally.bad_5xx, tally.unavailable, recovery,
                   callbacks_lost, callbacks_duplicated, readyz_503, "; ".join(notes))


def _keep_or_remove(workdir: Path, tally: Tally, failed: bool) -> None:
    """A failed run's directory (every process's log, the client's journal.jsonl) stays for the trace; said on
    stderr. A clean run's goes."""
    with open(workdir / "journal.jsonl", "w") as out:
        out.writelines(json.dumps(event) + "\n" for event in tally.journal)
    if failed:
        print(f"chaos: logs of the failed run kept in {workdir}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _starts_by_process(logs: list[str]) -> dict[str, list[tuple[int, int]]]:
    """Each task's starts in time order, tagged with the backend process (index, incarnation) that made them.

    A backend's log file is appended to across restarts; uvicorn's "Started server
    process" line opens each incarnation.
    """
    timed: dict[str, list[tuple[float, int, int]]] = {}
    for i, text in enumerate(logs):
        incarnation = -1
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            message = str(record.get("msg", ""))
            if message.startswith("Started server process"):
                incarnation += 1
            elif message == "task started" and record.get("task_id"):
                timed.setdefault(record["task_id"], []).append((float(record["ts"]), i, incarnation))
    return {task_id: [(i, n) for _, i, n in sorted(runs)] for task_id, runs in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--rate", type=float, default=4.0, help="submissions per second")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long to submit")
    parser.add_argument("--fault-at", type=float, default=3.0, help="seconds into the run")
    args = parser.parse_args()
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    print(HEADER, flush=True)
    for name in args.scenarios or SCENARIOS:
        print(run_scenario(name, args.rate, args.seconds, args.fault_at).row(), flush=True)


if __name__ == "__main__":
    main()
