"""Export types' definitions are removed by the janitor once no task names them, on every task store.

A task records its type's definition (under its digest) when it is created. When task retention has
deleted every task naming a definition, and no backend has recorded it within the grace (a backend
records the definitions it creates tasks under at least every RECORD_REFRESH_SEC), the janitor
removes it; one a task still names, or one recorded within the grace, stays.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import sqlalchemy as sa

from backend_stub import janitor
from backend_stub.result_store.file import FileResultStore
from backend_stub.store import sql_schema
from backend_stub.store.base import TaskStore
from backend_stub.store.sql_store import SqlTaskStore
from exports_common import sql
from exports_common.contract import Status
from tests.databases import SqlDatabase
from tests.test_store_contract import OpenStore, make_task, open_store

__all__ = ["open_store"]  # the store fixture, one run per store kind (sqlite, redis, mariadb, postgresql)


async def _task_under(store: TaskStore, digest: str, expire_at: float | None) -> str:
    task = make_task()
    if expire_at is not None:
        task = dataclasses.replace(task, status=Status.COMPLETED, expire_at=expire_at)
    await store.create(dataclasses.replace(task, type_digest=digest))
    return task.task_id


async def test_the_janitor_removes_definitions_no_task_names_after_the_grace(open_store: OpenStore,
                                                                            tmp_path: Path) -> None:
    store = await open_store()
    for digest in ("expired", "named", "unused"):
        await store.put_type_definition(digest, f'{{"source": {{"kind": "synthetic", "dataset": "{digest}"}}}}')
    await _task_under(store, "expired", expire_at=time.time() - 1)  # task retention deletes it
    kept = await _task_under(store, "named", expire_at=None)  # still running
    assert await janitor.sweep_once(store, FileResultStore(str(tmp_path))) == 1

    # within the grace nothing goes, even unnamed: a task may be on its way to naming it
    assert await janitor.drop_unused_definitions(store, time.time()) == 0
    assert await store.type_definition("expired") is not None

    later = time.time() + janitor.DEFINITION_GRACE_SEC + 1
    assert await janitor.drop_unused_definitions(store, later) == 2
    assert await store.type_definition("expired") is None and await store.type_definition("unused") is None
    assert await store.type_definition("named") is not None
    assert await store.get(kept) is not None

    # recorded again (a backend creates a task under it): kept through the grace from then
    await store.put_type_definition("again", "{}")
    peer = await open_store.peer(store)
    await peer.put_type_definition("again", "{}")
    assert await janitor.drop_unused_definitions(peer, time.time()) == 0
    assert await store.type_definition("again") == "{}"


async def test_a_sql_store_of_schema_v2_learns_when_definitions_were_recorded(sql_database: SqlDatabase) -> None:
    """Definitions kept before the migration count as recorded long ago: removed once no task names them."""
    engine = sql.make_engine(sql_database.url)
    with engine.connect() as conn:
        sql_schema.MIGRATIONS[0](conn)
        sql_schema.metadata.create_all(conn, tables=[sql_schema.schema_version])
        conn.exec_driver_sql("CREATE TABLE exports_type_definitions (digest VARCHAR(64) PRIMARY KEY, "
                             "definition TEXT NOT NULL)")
        conn.execute(sql_schema.schema_version.insert().values(one=1, version=2))
        conn.execute(sql_schema.type_definitions.insert().from_select(
            ["digest", "definition"], sa.select(sa.literal("old"), sa.literal("{}"))))
        conn.commit()
    store = SqlTaskStore(sql_database.url)
    await store.open()
    try:
        assert await store.type_definition("old") == "{}"
        assert await janitor.drop_unused_definitions(store, time.time()) == 1
        assert await store.type_definition("old") is None
    finally:
        await store.close()
    with engine.connect() as conn:
        assert sql_schema.current_version(conn) == sql_schema.VERSION
    engine.dispose()
