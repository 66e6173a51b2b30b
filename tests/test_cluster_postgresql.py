"""`make cluster STORE=postgresql`: the same topology with the backends' task store on PostgreSQL.

A file of its own, so that pytest-xdist runs it beside tests/test_cluster.py (each worker shifts the
cluster's ports to a range of its own).
"""
from __future__ import annotations

from pathlib import Path

import httpx
import sqlalchemy as sa

from backend_stub.store import sql_schema
from exports_common import sql
from exports_common.dev_mode import DEMO_API_KEYS
from tests.cluster_run import RunningCluster
from tests.databases import SqlDatabase
from tests.helpers import wait_status
from tests.test_cluster import _nginx

AUTH = {"Authorization": f"Bearer {DEMO_API_KEYS['demo']}"}
API = "/api/v1/exports"


def test_the_cluster_on_postgresql_starts_and_its_backends_keep_the_tasks_in_the_database(
        pg_database: SqlDatabase, tmp_path: Path) -> None:
    _nginx()
    cluster = RunningCluster(tmp_path, args=("--store", "postgresql", "--database-url", pg_database.url))
    try:
        cluster.start(timeout=120)
        assert "task store:     PostgreSQL" in cluster.output()
        ids = []
        for _ in range(4):  # nginx and the gateways spread them: both backends take tasks
            resp = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=20)
            assert resp.status_code == 202, resp.text
            ids.append(resp.json()["data"]["task_id"])
        for task_id in ids:
            wait_status(cluster.lb, task_id, {"COMPLETED"}, path=f"{API}/", headers=AUTH, timeout=60)
    finally:
        status = cluster.stop()
    assert status == 0, cluster.output()[-3000:]
    engine = sql.make_engine(pg_database.url)
    tasks = sql_schema.tasks
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.select(tasks.c.task_id, tasks.c.status)).all())
    engine.dispose()
    assert {task_id: stored.get(task_id) for task_id in ids} == {task_id: "COMPLETED" for task_id in ids}
