"""The task store on PostgreSQL and MariaDB as operators run it: config, start, migrations, several backends, faults.

The store's promises one by one are the contract suite's (tests/test_store_contract.py, which runs on
both servers too); here: the config refusals, the start-up checks, the schema under concurrent starts,
backends killed mid-run, and a database restart.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from pydantic import ValidationError

from backend_stub import lifecycle
from backend_stub.config import BackendConfig
from backend_stub.models import Task
from backend_stub.store import sql_schema
from backend_stub.store.sql_store import MINIMUM_VERSIONS, SqlTaskStore
from exports_common import sql
from exports_common.contract import Status
from exports_common.task_ids import new_task_id
from tests.conftest import backend_config, synthetic_type
from tests.databases import MariaDBInstance, PostgresInstance, SqlDatabase
from tests.helpers import backend_create, wait_status
from tests.procs import ROOT, SERVICE_TOKEN_ENV, Service, backend_headers, wait_until

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _config(**override: Any) -> BackendConfig:
    return BackendConfig.model_validate({"export_types": {"t": {"source": {"kind": "synthetic", "dataset": "orders",
                                                                           "rows": 10}}}} | override)


# -- config and start-up ------------------------------------------------------------------------------


@pytest.mark.inprocess
def test_both_urls_without_store_are_refused_naming_both_and_store_says_which() -> None:
    with pytest.raises(ValidationError) as refused:
        _config(database_url=PG_URL, redis_url="redis://127.0.0.1:6379/0")
    assert "database_url" in str(refused.value) and "redis_url" in str(refused.value) and "store" in str(refused.value)
    assert _config(database_url=PG_URL, redis_url="redis://x:1/0", store="sql").store_kind() == "sql"
    assert _config(database_url=PG_URL, redis_url="redis://x:1/0", store="redis").store_kind() == "redis"
    assert _config(database_url=PG_URL).store_kind() == "sql"
    assert _config().store_kind() == "sqlite", "the embedded default is unchanged"
    for bad, says in ((dict(store="sql"), "needs database_url"), (dict(database_url="sqlite:///x.db"), "SQLite"),
                      (dict(database_url="oracle://u@h/db"), "not supported")):
        with pytest.raises(ValidationError, match=says):
            _config(**bad)


@pytest.mark.inprocess
@pytest.mark.parametrize("server,version", [("postgresql", (12, 18)), ("mariadb", (10, 5, 9)), ("mysql", (5, 7, 44))])
def test_older_servers_are_refused_saying_which_and_what_is_needed(server: str, version: tuple[int, ...]) -> None:
    with pytest.raises(sql.SqlUnsupportedServer) as refused:
        sql.check_version((server, version), MINIMUM_VERSIONS, PG_URL)
    assert ".".join(map(str, version)) in refused.value.message and "PostgreSQL 13" in refused.value.message
    for supported in (("postgresql", (13, 0)), ("mariadb", (10, 6, 0)), ("mysql", (8, 0, 36))):
        sql.check_version(supported, MINIMUM_VERSIONS, PG_URL)


def test_a_backend_whose_database_is_unreachable_exits_with_one_line(tmp_path: Path) -> None:
    config = backend_config(tmp_path, database_url="postgresql://postgres@127.0.0.1:1/test")
    path = tmp_path / "backend.yaml"
    path.write_text(yaml.safe_dump(config))
    ended = subprocess.run([sys.executable, "-m", "backend_stub", "run", "--config", str(path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, env=os.environ | SERVICE_TOKEN_ENV)
    assert ended.returncode == 2, ended.stderr
    assert "Traceback" not in ended.stderr and ended.stderr.count("\n") == 1, ended.stderr
    assert "cannot reach the database at postgresql" in ended.stderr and "127.0.0.1:1/test" in ended.stderr


# -- schema -------------------------------------------------------------------------------------------


async def test_the_schema_is_created_from_empty_once_when_two_backends_start_at_once(
        sql_database: SqlDatabase) -> None:
    stores = [SqlTaskStore(sql_database.url) for _ in range(3)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        task = Task(task_id=new_task_id(), tenant="t", export_type="x", filters={}, format="csv", timeout_sec=60,
                    callback_url=None, fingerprint="f", created_at=time.time(), updated_at=time.time())
        await stores[0].create(task)
        assert (got := await stores[2].get(task.task_id)) is not None and got.task_id == task.task_id
    finally:
        for store in stores:
            await store.close()
    engine = sql.make_engine(sql_database.url)
    with engine.connect() as conn:
        assert sql_schema.current_version(conn) == sql_schema.VERSION
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_schema.schema_version)).scalar() == 1
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_schema.change_log)).scalar() == 1
        # a database a newer release migrated is refused, not written with an older schema
        conn.execute(sql_schema.schema_version.update().values(version=sql_schema.VERSION + 1))
        conn.commit()
    engine.dispose()
    with pytest.raises(sql.SqlFailed, match="newer than this release"):
        await SqlTaskStore(sql_database.url).open()


async def test_a_migration_cut_short_by_a_crash_is_finished_by_the_next_start(sql_database: SqlDatabase) -> None:
    """A backend killed mid-way left the version at 0 with some of the tables made: the next start finishes."""
    engine = sql.make_engine(sql_database.url)
    with engine.begin() as conn:
        sql_schema.metadata.create_all(conn, tables=[sql_schema.schema_version, sql_schema.tasks,
                                                     sql_schema.change_log])
        conn.execute(sql_schema.schema_version.insert().values(one=1, version=0))
        conn.execute(sql_schema.change_log.insert().values(one=1, last_id=0, trimmed_through=0))
    store = SqlTaskStore(sql_database.url)
    await store.open()
    try:
        assert await store.latest_change_id() is None and await store.claim("c", 30, 0) is None
    finally:
        await store.close()
    with engine.connect() as conn:
        assert sql_schema.current_version(conn) == sql_schema.VERSION
    engine.dispose()


async def test_a_database_at_the_previous_schema_version_is_migrated_once_by_two_backends_starting_at_once(
        sql_database: SqlDatabase) -> None:
    """The version before the current one, with a task queued: both starts end on the current version (every table
    with the current columns), one migrating and the other waiting on the advisory lock; the task is still there and
    claimable."""
    previous = sql_schema.VERSION - 1
    engine = sql.make_engine(sql_database.url)
    now = time.time()
    task = Task(task_id=new_task_id(), tenant="t", export_type="x", filters={}, format="csv", timeout_sec=60,
                callback_url=None, fingerprint="f", created_at=now, updated_at=now)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        sql_schema.metadata.create_all(conn, tables=[sql_schema.schema_version])
        conn.execute(sql_schema.schema_version.insert().values(one=1, version=0))
        for migration in sql_schema.MIGRATIONS[:previous]:
            migration(conn)
        conn.execute(sql_schema.schema_version.update().values(version=previous))
        conn.execute(sql_schema.tasks.insert().values(task_id=task.task_id, tenant="t", status=task.status,
                                                      created_at=now, body=task.to_json()))
        conn.execute(sql_schema.queue.insert().values(task_id=task.task_id, tenant="t"))
        conn.execute(sql_schema.turns.insert().values(tenant="t", turn=0, served_at_turn=0))
    stores = [SqlTaskStore(sql_database.url) for _ in range(2)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        assert (got := await stores[1].get(task.task_id)) is not None and got.task_id == task.task_id
        await stores[0].put_type_definition("d" * 64, "{}")
        assert await stores[1].type_definition("d" * 64) == "{}"
        lease = await stores[1].claim("c", 30, 0)
        assert lease is not None and lease.task_id == task.task_id, "the queue kept its task across the upgrade"
    finally:
        for store in stores:
            await store.close()
    with engine.connect() as conn:
        assert sql_schema.current_version(conn) == sql_schema.VERSION
        assert conn.execute(sa.select(sa.func.count()).select_from(sql_schema.schema_version)).scalar() == 1
        inspector = sa.inspect(conn)
        for table in sql_schema.metadata.sorted_tables:
            assert {column["name"] for column in inspector.get_columns(table.name)} == set(table.c.keys()), table.name
    engine.dispose()


# -- a task's cost ------------------------------------------------------------------------------------


async def test_every_call_runs_at_read_committed_and_a_task_costs_its_statement_budget(
        sql_database: SqlDatabase) -> None:
    """READ COMMITTED is set once per connection, and stays after the migration's autocommit use of it; a task's
    life (create, claim, RUNNING, COMPLETED with the ack) costs at most 17 statements on PostgreSQL, 21 on
    MariaDB (the design's count: each is a round trip, and each call's transaction a commit)."""
    store = SqlTaskStore(sql_database.url, settings=sql.EngineSettings(pool_size=1))  # the migration's connection
    await store.open()
    try:
        level = "SHOW transaction_isolation" if store.postgres else "SELECT @@tx_isolation"  # MariaDB 10
        for _ in range(2):
            async with store.engine.begin() as conn:
                assert (await conn.execute(sa.text(level))).scalar() in ("read committed", "READ-COMMITTED")
        sent = [0]

        def counted(*_: Any) -> None:
            sent[0] += 1

        async def life() -> None:
            now = time.time()
            task = Task(task_id=new_task_id(), tenant="t", export_type="x", filters={}, format="csv",
                        timeout_sec=60, callback_url=None, fingerprint="f", created_at=now, updated_at=now)
            await store.create(task)
            lease = await store.claim("c", 30, 0)
            assert lease is not None and lease.task_id == task.task_id
            await store.update(task.task_id, lambda t: dataclasses.replace(t, status=Status.RUNNING, attempt=1))
            done, changed = await store.update(task.task_id, lifecycle.finish(Status.COMPLETED), ack=lease)
            assert changed and done is not None and done.status == Status.COMPLETED

        await life()  # the tenant's first task also makes its row in the turns
        sa.event.listen(store.engine.sync_engine, "before_cursor_execute", counted)
        await life()
        assert sent[0] <= (17 if store.postgres else 21), f"{sent[0]} statements for one task's life"
        assert await store.claim("c", 30, 0) is None, "the queue is empty: each task was acked"
    finally:
        await store.close()


# -- several processes --------------------------------------------------------------------------------


SLOWISH = synthetic_type("orders", 2000, 9, fault={"delay_sec": 1.5})


def _logged(backend: Service, message: str) -> set[str]:
    """The tasks the backend's log names with `message` ("task started", "task ended")."""
    return {record["task_id"] for record in map(json.loads, (line for line in backend.log().splitlines()
                                                              if f'"msg": "{message}"' in line))}


def _started(backend: Service) -> set[str]:
    return _logged(backend, "task started")


def _sql_backends(request: pytest.FixtureRequest, tmp_path: Path, url: str, n: int, **override: Any
                  ) -> list[Service]:
    """`n` backends on the database, stopped at the end of the test. Up to 60 s to start each: on the loaded
    2-core machine the imports alone took 10 s."""
    config = backend_config(tmp_path, database_url=url, **override)
    backends = []
    for i in range(n):
        backend = Service("backend_stub", dict(config, data_dir=str(tmp_path / f"data{i}")), tmp_path, f"backend-{i}")
        request.addfinalizer(backend.stop)
        backends.append(backend.start(timeout=60))
    return backends


def test_two_backends_one_killed_mid_run_every_task_completes_and_the_killed_ones_run_once_more(
        pg_database: SqlDatabase, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """On PostgreSQL only, for the test budget: a takeover on MariaDB is the contract suite's (same code)."""
    backends = _sql_backends(request, tmp_path, pg_database.url, 2, workers=2, lease_sec=8,
                             result_store=f"file://{tmp_path / 'results'}", export_types={"slowish": SLOWISH})
    ids = [backend_create(backends[i % 2].url, {"export_type": "slowish"}).json()["data"]["task_id"]
           for i in range(8)]
    victim, survivor = backends
    wait_until(lambda: _started(victim) and _started(survivor), 20, what="both backends running tasks")
    assert victim.proc is not None
    pid = victim.proc.pid
    victim.kill()
    # what it held when it died: its leases (consumers are named HOST-PID), before they run out in 8 s (long:
    # on the loaded machine a live backend stalled for seconds, and a stall past the lease is a takeover)
    queue = sql_schema.queue
    engine = sql.make_engine(pg_database.url)
    with engine.connect() as conn:
        interrupted = set(conn.execute(sa.select(queue.c.task_id).where(
            queue.c.lease_owner.like(f"%-{pid}%"))).scalars()) & _started(victim)  # claimed and begun, not only claimed
    engine.dispose()
    finals = {t: wait_status(survivor.url, t, timeout=60) for t in ids}
    assert {f["status"] for f in finals.values()} == {"COMPLETED"}, "no task lost"
    assert interrupted, "the killed backend held tasks mid-run"
    for task_id in interrupted:
        assert finals[task_id]["attempt"] == 2, "an interrupted task runs exactly one more time"
        assert task_id in _started(survivor)
    assert all(final["attempt"] == 1 for t, final in finals.items() if t not in interrupted), \
        "nothing else ran twice"
    assert httpx.get(f"{survivor.url}/exports/{ids[0]}/file", headers=backend_headers(), timeout=10).status_code == 200


# -- a database restart -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_database_restart_gives_503_with_retry_after_and_recovers_by_itself_losing_nothing(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    server: PostgresInstance | MariaDBInstance = request.getfixturevalue(
        "private_postgres" if kind == "postgresql" else "private_mariadb")
    quick = synthetic_type("orders", 200, 9, fault={"delay_sec": 0.3})
    (backend,) = _sql_backends(request, tmp_path, server.url, 1, workers=2, lease_sec=5, database_pool_timeout_sec=2,
                               export_types={"quick": quick})
    accepted = [backend_create(backend.url, {"export_type": "quick"}).json()["data"]["task_id"] for _ in range(4)]
    answers: list[httpx.Response] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            response = backend_create(backend.url, {"export_type": "quick"})
            answers.append(response)
            if response.status_code == 201:
                accepted.append(response.json()["data"]["task_id"])
            time.sleep(0.05)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        server.stop()
        wait_until(lambda: any(r.status_code == 503 for r in answers[-3:]), 20, what="a 503 while the database is down")
        ready = httpx.get(f"{backend.url}/readyz", timeout=10)
        assert ready.status_code == 503 and ready.headers.get("Retry-After"), ready.text
        server.start()
        wait_until(lambda: httpx.get(f"{backend.url}/readyz", timeout=10).status_code == 200, 30,
                   what="/readyz 200 again once the database is back")
        wait_until(lambda: any(r.status_code == 201 for r in answers[-3:]), 20, what="submits accepted again")
    finally:
        stop.set()
        loader.join(30)
    down = [r for r in answers if r.status_code not in (201,)]
    assert down and all(r.status_code == 503 and r.headers.get("Retry-After") for r in down), \
        [(r.status_code, r.text[:200]) for r in down]
    for task_id in accepted:
        assert wait_status(backend.url, task_id, timeout=60)["status"] == "COMPLETED", "nothing accepted is lost"


def test_a_database_stalled_for_half_the_lease_runs_no_task_twice(
        private_postgres: PostgresInstance, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The server SIGSTOPped for lease/2 while two tasks run, with idle workers on both backends ready to claim:
    each task runs exactly once (attempt 1, one "task started" over both backends)."""
    lease = 8.0
    working = synthetic_type("orders", 2000, 9, fault={"delay_sec": lease})
    backends = _sql_backends(request, tmp_path, private_postgres.url, 2, workers=2, lease_sec=lease,
                             database_pool_timeout_sec=2, result_store=f"file://{tmp_path / 'results'}",
                             export_types={"working": working})
    ids = [backend_create(backends[i].url, {"export_type": "working"}).json()["data"]["task_id"] for i in range(2)]
    wait_until(lambda: set(ids) <= _started(backends[0]) | _started(backends[1]), 30, what="both tasks running")
    private_postgres.pause()
    try:
        time.sleep(lease / 2)  # the fault itself lasts this long: it is what the test is about
    finally:
        private_postgres.resume()
    finals = {t: wait_status(backends[0].url, t, timeout=60) for t in ids}
    assert {f["status"] for f in finals.values()} == {"COMPLETED"}, finals
    assert all(final["attempt"] == 1 for final in finals.values()), finals
    starts = Counter(t for backend in backends for line in backend.log().splitlines()
                     if '"msg": "task started"' in line for t in ids if t in line)
    assert starts == Counter(ids), f"each task started once over both backends: {starts}"


async def test_an_exhausted_pool_fails_within_the_pool_timeout_as_busy_not_a_hang(sql_database: SqlDatabase) -> None:
    store = SqlTaskStore(sql_database.url, settings=sql.EngineSettings(pool_size=1, pool_timeout=0.5))
    await store.open()
    try:
        async with store.engine.connect():  # the pool's only connection, held
            started = time.monotonic()
            with pytest.raises(sql.SqlBusy) as busy:
                await store.get(new_task_id())
            assert time.monotonic() - started < 2.0 and busy.value.retryable
        assert await store.get(new_task_id()) is None, "served again once a connection is free"
    finally:
        await store.close()


async def test_a_stalled_database_fails_a_call_within_its_bound_and_serves_again_after(
        private_postgres: PostgresInstance) -> None:
    store = SqlTaskStore(private_postgres.url, settings=sql.EngineSettings(pool_timeout=1, connect_timeout=2))
    await store.open()
    try:
        assert await store.get(new_task_id()) is None
        private_postgres.pause()
        started = time.monotonic()
        with pytest.raises(sql.SqlUnreachable):
            await store.get(new_task_id())
        assert time.monotonic() - started < store.call_timeout + 2, "bounded, not a hang"
        private_postgres.resume()
        assert await store.get(new_task_id()) is None
    finally:
        private_postgres.resume()
        await asyncio.wait_for(store.close(), 15)
