"""Chaos as a tool: two gateways, two backends and one private Redis, a retrying client, and faults.

Each scenario starts a fresh stack (gateway A → backend 1, gateway B → backend 2,
both backends sharing one result directory, everything on one Redis with an
append-only file), submits at a steady rate through random gateways for a while,
injects its fault, and then polls every task id the client obtained until it is
terminal. The client does what a careful client does: it retries a submission
with the same Idempotency-Key (after Retry-After, through either gateway) until
it gets an id, for up to a minute.

Per scenario it prints: submitted; ids obtained; completed; lost (an id the client
held that never completed, or went 404); duplicated (one key answered with two
ids, or one task started twice although no process running it died); re-run
after a kill (a task started again because the backend process running it was
killed: allowed, and each such task runs exactly twice); 500s (any
5xx other than a 503 with Retry-After: the answers that are bugs); 503s with
Retry-After (the designed answer while a dependency is down); and recovery (seconds
from the end of the fault to the last failed client call).

    python -m benchmarks.chaos                      # every scenario (a few minutes)
    python -m benchmarks.chaos redis_stall backend_kill --rate 4 --seconds 8
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import random
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.procs import RedisServer, Service

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
EXPORT_TYPE = "chaos_export"
# ~1.5 s per task: long enough that faults land on running exports
EXPORT_TYPES = {EXPORT_TYPE: synthetic_type("orders", 5000, 11, fault={"delay_sec": 1.5})}
LEASE_SEC = 15.0  # longer than the 10 s Redis stall: that stall must not run any task twice
GIVE_UP_SEC = 60.0
# the limiter (once it exists) still runs; a chaos client must not be rate limited
LIMITS_ENV = {"TENANT_REQUESTS_PER_SEC": "10000", "TENANT_REQUESTS_BURST": "20000",
              "TENANT_SUBMITS_PER_SEC": "10000", "TENANT_SUBMITS_BURST": "20000", "TENANT_MAX_ACTIVE_TASKS": "100000"}


class Stack:
    """Two gateways, two backends, one Redis; faults by name."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis", persistent=True)
        (workdir / "redis").mkdir()
        self.backends: list[Service] = []
        self.gateways: list[Service] = []
        # (backend index, incarnation) of every backend process that was killed
        self.killed: set[tuple[int, int]] = set()
        self.incarnation = [0, 0]

    def start(self) -> Stack:
        self.redis.start()
        shared = self.workdir / "results"  # both backends serve each other's files (no shared store yet)
        for i in range(2):
            config = backend_config(self.workdir, self.redis.url, data_dir=str(shared), workers=4,
                                    lease_sec=LEASE_SEC, progress_interval_sec=0.2, export_types=EXPORT_TYPES,
                                    log_level="info")
            self.backends.append(Service("backend_stub", config, self.workdir, f"backend-{i + 1}").start())
        for i, backend in enumerate(self.backends):
            config = gateway_config(self.workdir, backend.url, self.redis.url)
            self.gateways.append(Service("gateway", config, self.workdir, f"gateway-{'AB'[i]}",
                                         env=LIMITS_ENV).start())
        return self

    def stop(self) -> None:
        for service in [*self.gateways, *self.backends]:
            service.stop()
        self.redis.stop()

    def kill_backend(self, i: int) -> None:
        self.backends[i].kill()
        self.killed.add((i, self.incarnation[i]))

    def restart_backend(self, i: int) -> None:
        self.incarnation[i] += 1
        self.backends[i].start(timeout=60)  # a loaded two-core machine starts Python slowly


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


class Client:
    def __init__(self, stack: Stack, tally: Tally) -> None:
        self.stack = stack
        self.tally = tally
        self.http = httpx.AsyncClient(timeout=20.0, headers=AUTH)

    def _gateway(self) -> str:
        return random.choice(self.stack.gateways).url

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
            try:
                resp = await self.http.post(self._gateway() + API, json=body, headers={"Idempotency-Key": key})
            except httpx.HTTPError as exc:
                self._failed(f"submit {type(exc).__name__}")
                await asyncio.sleep(0.2)
                continue
            if resp.status_code == 202:
                self.tally.ids.setdefault(key, set()).add(resp.json()["data"]["task_id"])
                # ask again once more, through either gateway: a second id would be a duplicate
                if len(self.tally.ids[key]) == 1 and random.random() < 0.3:
                    await asyncio.sleep(0.5)
                    continue
                return
            await asyncio.sleep(self._classify(resp, "submit"))

    async def wait_terminal(self, task_id: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                resp = await self.http.get(f"{self._gateway()}{API}/{task_id}")
            except httpx.HTTPError as exc:
                self._failed(f"poll {type(exc).__name__}")
                await asyncio.sleep(0.5)
                continue
            if resp.status_code == 200:
                status = resp.json()["data"]["status"]
                if status == "COMPLETED":
                    self.tally.completed.add(task_id)
                    return
                if status in ("FAILED", "CANCELLED", "TIMEOUT"):
                    return
                await asyncio.sleep(1.0)
                continue
            if resp.status_code == 404:
                return  # forgotten: counted as lost
            await asyncio.sleep(self._classify(resp, "poll"))


Fault = Callable[[Stack], Coroutine[Any, Any, float]]  # injects; returns the monotonic time the fault ended


async def _later(seconds: float, action: Callable[[], object]) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(action)


def _scenarios(at: float) -> dict[str, Fault]:
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

    return {"baseline": baseline, "backend_kill": backend_kill, "gateway_kill": gateway_kill,
            "redis_stall": redis_stall, "redis_kill_aof": redis_kill_aof,
            "redis_restart_empty": redis_restart_empty, "backends_down": backends_down}


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
    note: str = ""

    def row(self) -> str:
        return (f"| {self.scenario} | {self.submitted} | {self.obtained} | {self.completed} | {self.lost} | "
                f"{self.duplicated} | {self.rerun_after_kill} | {self.bad_5xx} | {self.unavailable} | "
                f"{self.recovery_sec:.1f} | {self.note} |")


HEADER = ("| scenario | submitted | ids obtained | completed | lost | duplicated | re-run after a kill | 500s | "
          "503 + Retry-After | recovery (s) | note |\n|---|---|---|---|---|---|---|---|---|---|---|")


@contextlib.contextmanager
def running_stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        stack = Stack(Path(tmp))
        try:
            yield stack.start()
        finally:
            stack.stop()


async def _drive(stack: Stack, fault: Fault, rate: float, seconds: float) -> tuple[Tally, float]:
    tally = Tally()
    client = Client(stack, tally)
    run = f"{time.time_ns():x}"
    submits = []
    fault_task = asyncio.create_task(fault(stack))
    for n in range(int(rate * seconds)):
        body = {"export_type": EXPORT_TYPE, "format": "csv"}
        submits.append(asyncio.create_task(client.submit_and_follow(f"chaos-{run}-{n}", body)))
        await asyncio.sleep(1 / rate)
    fault_end = await fault_task
    await asyncio.gather(*submits)
    await client.http.aclose()
    return tally, fault_end


def run_scenario(name: str, rate: float, seconds: float, fault_at: float) -> Outcome:
    with running_stack() as stack:
        tally, fault_end = asyncio.run(_drive(stack, _scenarios(fault_at)[name], rate, seconds))
        starts = _starts_by_process(stack)
    ids = {task_id for answered in tally.ids.values() for task_id in answered}
    note = ""
    considered = ids
    if name == "redis_restart_empty":
        # a Redis without its data has forgotten every task: only what was submitted after it counts
        considered = {t for key, answered in tally.ids.items() for t in answered
                      if tally.submitted_at[key] > fault_end}
        note = f"{len(ids - considered)} ids from before the restart are gone with Redis's data; not counted"
    lost = len(considered - tally.completed)
    two_ids = sum(1 for key, answered in tally.ids.items() if len(answered) > 1 and answered & considered)
    ran_twice = sum(1 for task_id, procs in starts.items()
                    if len(procs) > 1 and not any(p in stack.killed for p in procs[:-1]))
    rerun_after_kill = sum(1 for procs in starts.values() if len(procs) > 1) - ran_twice
    suspects = [k for k, answered in tally.ids.items() if len(answered) > 1 and answered & considered][:2] + [
        t for t, procs in starts.items() if len(procs) > 1 and not any(p in stack.killed for p in procs[:-1])][:2]
    if suspects:
        note = (note + "; " if note else "") + "duplicated: " + ", ".join(suspects)
    errors_after = [t for t in tally.error_times if t > fault_end]
    recovery = max(errors_after) - fault_end if errors_after and name != "baseline" else 0.0
    return Outcome(name, tally.submitted, len(tally.ids), len(considered & tally.completed), lost,
                   two_ids + ran_twice, rerun_after_kill, tally.bad_5xx, tally.unavailable, recovery, note)


def _starts_by_process(stack: Stack) -> dict[str, list[tuple[int, int]]]:
    """Each task's starts in time order, tagged with the backend process (index, incarnation) that made them.

    A backend's log file is appended to across restarts; uvicorn's "Started server
    process" line opens each incarnation.
    """
    timed: dict[str, list[tuple[float, int, int]]] = {}
    for i, backend in enumerate(stack.backends):
        incarnation = -1
        for line in backend.log().splitlines():
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
