"""Fair scheduling in the backend, in real backend processes on both stores (SQLite; Redis, two processes).

The exact turn order is the store contract's (tests/test_store_contract.py); here the promises as a
tenant sees them: a backlog of one tenant does not hold back another's task, weights give shares,
the running cap holds while polled, and a backend killed mid-run loses no task and breaks no cap.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from exports_common.task_ids import new_task_id
from tests.conftest import backend_config, synthetic_type
from tests.helpers import backend_create, wait_status
from tests.procs import RedisServer, Service, backend_headers, wait_until

TENANT_A, TENANT_B = "flooder", "quiet"


def _types(delay_sec: float) -> dict[str, Any]:
    return {"paced": synthetic_type("report", 10, fault={"delay_sec": delay_sec})}


def _backends(kind: str, services: Callable[..., Service], tmp_path: Path, request: pytest.FixtureRequest,
              processes: int = 1, **config: Any) -> list[Service]:
    """One SQLite backend, or `processes` backends on one Redis (the scheduler then spans processes)."""
    if kind == "sqlite":
        return [services("backend_stub", backend_config(tmp_path, **config))]
    redis: RedisServer = request.getfixturevalue("redis_server")
    shared = backend_config(tmp_path, redis.url, redis_prefix=f"fair{time.time_ns()}", **config)
    return [services("backend_stub", dict(shared), name=f"backend-{n}") for n in range(processes)]


def _submit(url: str, tenant: str, n: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=10) as http:
        ids = [new_task_id() for _ in range(n)]
        for task_id in ids:
            resp = http.post("/exports", json={"export_type": "paced"},
                             headers=backend_headers(tenant, **{"X-Task-Id": task_id}))
            assert resp.status_code == 201, resp.text
    return ids


def _logged(backends: list[Service], message: str) -> dict[str, float]:
    """When each task was first logged with `message` ("task started", "task ended"): the API does not show it."""
    first: dict[str, float] = {}
    for backend in backends:
        for line in backend.log().splitlines():
            if f'"msg": "{message}"' in line:
                record = json.loads(line)
                first[record["task_id"]] = min(record["ts"], first.get(record["task_id"], record["ts"]))
    return first


def _tasks(url: str, tenant: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        params = {"limit": "100"} | ({"cursor": cursor} if cursor else {})
        data = httpx.get(f"{url}/exports", params=params, headers=backend_headers(tenant), timeout=10).json()["data"]
        items += data["items"]
        cursor = data.get("next_cursor")
        if not cursor:
            break
    return items


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_another_tenants_task_starts_at_the_next_free_worker_behind_a_backlog_of_hundreds(
        kind: str, services: Callable[..., Service], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    duration = 0.5
    backends = _backends(kind, services, tmp_path, request, workers=1, export_types=_types(duration))
    url = backends[0].url
    _submit(url, TENANT_A, 200)
    wait_until(lambda: sum(t["status"] == "RUNNING" for t in _tasks(url, TENANT_A)) == len(backends), 15,
               what="every worker busy with the flooder's tasks")
    task_id = _submit(url, TENANT_B, 1)[0]
    queued = time.time()
    wait_status(url, task_id, {"RUNNING", "COMPLETED"}, timeout=10, tenant=TENANT_B)
    starts = _logged(backends, "task started")
    waited = starts[task_id] - queued
    # under one FIFO it waited for the whole backlog: 200 x 0.5 s / workers
    assert waited < duration + 1.0, f"waited {waited:.2f} s behind the backlog; one task lasts {duration} s"
    # at most one: a flooder's task the worker claimed before the quiet one's was queued, logged a moment later
    jumped = [t for t, at in starts.items() if queued < at < starts[task_id]]
    assert len(jumped) <= 1, f"{len(jumped)} of the flooder's tasks started first; the next free worker takes it"


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_weights_give_proportional_shares(kind: str, services: Callable[..., Service], tmp_path: Path,
                                          request: pytest.FixtureRequest) -> None:
    types = _types(0.05) | {"blocker": synthetic_type("report", 10, fault={"delay_sec": 2.5})}
    backends = _backends(kind, services, tmp_path, request, workers=1, export_types=types,
                         scheduler={"weights": {TENANT_A: 3}})
    url = backends[0].url
    # every worker busy with a blocker while both tenants queue, so that the turns start with both waiting
    for _ in backends:
        backend_create(url, {"export_type": "blocker"}, tenant="blocker")
    wait_until(lambda: all(t["status"] == "RUNNING" for t in _tasks(url, "blocker")), 10, what="blockers running")
    owner = {t: TENANT_A for t in _submit(url, TENANT_A, 16)} | {t: TENANT_B for t in _submit(url, TENANT_B, 16)}
    assert not set(owner) & set(_logged(backends, "task started")), "both queues were full before the first turn"
    wait_until(lambda: sum(t in owner for t in _logged(backends, "task started")) >= 16, 30,
               what="16 of the tasks started")
    order = sorted((at, t) for t, at in _logged(backends, "task started").items() if t in owner)
    share = sum(owner[t] == TENANT_A for _, t in order[:16])
    assert 11 <= share <= 13, f"weight 3 against 1: {share} of the first 16 turns went to the weight 3"


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_running_cap_holds_while_polled_and_through_a_kill(kind: str, services: Callable[..., Service],
                                                            tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cap = 2
    # six workers in all (one process of six, or two of three), so that the cap, not the workers, limits a
    backends = _backends(kind, services, tmp_path, request, processes=2, workers=6 if kind == "sqlite" else 3,
                         lease_sec=2,
                         export_types=_types(0.5),
                         scheduler={"max_running": {TENANT_A: cap}})
    url = backends[-1].url
    flood = _submit(url, TENANT_A, 8)
    quiet = _submit(url, TENANT_B, 4)
    running_seen: list[int] = []
    killed = False
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        tasks = _tasks(url, TENANT_A)
        running_seen.append(sum(t["status"] == "RUNNING" for t in tasks))
        assert running_seen[-1] <= cap, f"{running_seen[-1]} of the capped tenant's tasks RUNNING (cap {cap})"
        if not killed and sum(t["status"] == "COMPLETED" for t in tasks) >= 2:
            backends[0].kill()  # mid-run: it holds leases; the survivor (or the restart) takes them over
            if kind == "sqlite":
                backends[0].start()
            killed = True
        if all(t["status"] == "COMPLETED" for t in tasks):
            break
        time.sleep(0.05)
    assert killed and max(running_seen) == cap, f"the cap was reached (not merely unused): {running_seen}"
    for tenant, task_id in [(TENANT_A, t) for t in flood] + [(TENANT_B, t) for t in quiet]:
        assert wait_status(url, task_id, timeout=20, tenant=tenant)["status"] == "COMPLETED", "no task lost by the kill"
    started = _logged(backends, "task started")
    assert max(started[t] for t in quiet) < sorted(started[t] for t in flood)[cap], \
        "the other tenant's tasks took the workers the capped tenant could not use"
