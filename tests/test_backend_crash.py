"""Crash safety: kill -9 a backend mid-task; every task still ends exactly once."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import httpx

from tests.conftest import backend_config, synthetic_type
from tests.helpers import backend_create, backend_task, wait_status
from tests.procs import RedisServer, Service, backend_headers, wait_until

SLOWISH = synthetic_type("orders", 20000, 9, fault={"delay_sec": 2})


def _running(url: str, ids: list[str]) -> list[str]:
    return [t for t in ids if backend_task(url, t)["status"] == "RUNNING"]


def test_sqlite_restart_after_kill_finishes_every_task_once(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, workers=2, export_types={"slowish": SLOWISH}))
    ids = [backend_create(backend.url, {"export_type": "slowish"}).json()["data"]["task_id"] for _ in range(4)]
    running = wait_until(lambda: len(_running(backend.url, ids)) == 2 and _running(backend.url, ids), 10,
                         what="two tasks running")
    backend.kill()
    backend.start()

    finals = {t: wait_status(backend.url, t, timeout=30) for t in ids}
    assert {f["status"] for f in finals.values()} == {"COMPLETED"}
    for task_id in running:
        assert finals[task_id]["attempt"] == 2, "the interrupted attempt counts; the task ran again"
    listed = httpx.get(f"{backend.url}/exports", headers=backend_headers("t1")).json()["data"]["items"]
    assert sorted(t["task_id"] for t in listed) == sorted(ids)
    files = sorted(p.name for p in (tmp_path / "backend-data" / "files").iterdir())
    assert files == sorted(f"{t}.csv" for t in ids), "one final file per task and no partial files"


def test_redis_other_backend_takes_over_within_lease(services: Callable[..., Service], tmp_path: Path,
                                                     redis_server: RedisServer) -> None:
    config = backend_config(tmp_path, redis_server.url, workers=1, lease_sec=2, redis_prefix="takeover",
                            export_types={"slowish": SLOWISH})
    first = services("backend_stub", dict(config), name="backend-a")
    second = services("backend_stub", dict(config), name="backend-b")
    task_id = backend_create(first.url, {"export_type": "slowish"}).json()["data"]["task_id"]
    wait_status(first.url, task_id, {"RUNNING"})
    owner, other = (first, second) if task_id in first.log() else (second, first)
    wait_until(lambda: task_id in owner.log(), 5, what="the owner's log to name the task")
    owner.kill()

    done = wait_status(other.url, task_id, timeout=20)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2
    assert "task started" in other.log() and task_id in other.log()
    assert httpx.get(f"{other.url}/exports/{task_id}/file", headers=backend_headers()).status_code == 200
