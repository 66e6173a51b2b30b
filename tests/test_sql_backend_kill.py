"""kill -9 of a backend mid-query of a SQL export: another backend re-runs the task, the dead query ends on the server.

Two backends share a Redis task store. The export's query is slow on the server (a short sleep per
row), so the first attempt is still running there when its backend is killed. The other backend
takes the task over when the lease runs out and exports it again: the file equals a direct query.
PostgreSQL notices the dead client on its own (the source sets `client_connection_check_interval`
on its attempts, PostgreSQL 14+), so the orphaned query is gone from pg_stat_activity within 30 s.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from tests.conftest import backend_config
from tests.databases import SqlDatabase
from tests.helpers import backend_create, wait_status
from tests.procs import RedisServer, Service, backend_headers, wait_until
from tests.test_sql_source import engine_of

ROWS = 2_000
SLOW = "SELECT id, tenant, amount FROM sales WHERE pg_sleep(0.002)::text = ''"  # about 4 s of server time


def _queries(database: SqlDatabase) -> set[int]:
    """The server processes running the backends' export statements."""
    engine = engine_of(database)
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :db AND state = 'active' "
                                     "AND application_name = 'export-backend'"), {"db": database.name}).scalars()
        pids = {int(pid) for pid in found}
    engine.dispose()
    return pids


def _direct(database: SqlDatabase) -> list[dict[str, Any]]:
    engine = engine_of(database)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, tenant, amount FROM sales WHERE tenant = 't1' ORDER BY id").all()
    engine.dispose()
    return [{"id": i, "tenant": t, "amount": float(a)} for i, t, a in rows]


def test_a_backend_killed_mid_query_another_reruns_the_task_and_the_server_ends_the_query(
        services: Callable[..., Service], pg_database: SqlDatabase, redis_server: RedisServer,
        tmp_path: Path) -> None:
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE sales (id INTEGER PRIMARY KEY, tenant TEXT, amount NUMERIC(12,2))")
        conn.exec_driver_sql(f"INSERT INTO sales SELECT g, 't' || (g %% 2), g / 100.0 "
                             f"FROM generate_series(1, {ROWS}) AS g")
    engine.dispose()
    config = backend_config(tmp_path, redis_server.url, workers=1, lease_sec=2, redis_prefix="sqlkill",
                            export_types={"slow": {"source": {"kind": "sql", "url": pg_database.url, "query": SLOW,
                                                              "key": "id", "tenant_column": "tenant"},
                                                   "formats": ["jsonl"], "max_attempts": 3}})
    first = services("backend_stub", dict(config), name="backend-a")
    second = services("backend_stub", dict(config), name="backend-b")
    created = backend_create(first.url, {"export_type": "slow"})
    assert created.status_code == 201, created.text
    task_id = created.json()["data"]["task_id"]
    dead = wait_until(lambda: _queries(pg_database), 20, what="the first attempt's query on the server")
    owner, other = (first, second) if task_id in first.log() else (second, first)
    owner.kill()
    killed_at = time.monotonic()

    wait_until(lambda: not dead & _queries(pg_database), 30, interval=0.2, what="the dead backend's query to end")
    assert time.monotonic() - killed_at < 30
    done = wait_status(other.url, task_id, timeout=60)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2, done
    file = httpx.get(f"{other.url}{done['result']['download_url']}", headers=backend_headers(), timeout=30)
    assert file.status_code == 200
    assert [json.loads(line) for line in file.text.splitlines()] == _direct(pg_database)
