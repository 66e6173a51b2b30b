"""The storage interface's promises, checked against both implementations with the same tests."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import AsyncIterator

import pytest

from backend_stub.models import Task
from backend_stub.store.base import TaskStore
from backend_stub.store.redis_store import RedisTaskStore
from backend_stub.store.sqlite_store import SqliteTaskStore
from exports_common.contract import Status
from exports_common.task_ids import new_task_id
from tests.procs import RedisServer


@pytest.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TaskStore]:
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        impl: TaskStore = RedisTaskStore(redis.url, f"contract{time.time_ns()}")
    else:
        impl = SqliteTaskStore(str(tmp_path))
    await impl.open()
    yield impl
    await impl.close()


def make_task(tenant: str = "t", created_at: float | None = None) -> Task:
    now = created_at or time.time()
    return Task(task_id=new_task_id(), tenant=tenant, export_type="order_export", filters={}, format="csv",
                timeout_sec=60, callback_url=None, fingerprint="f", created_at=now, updated_at=now)


async def test_create_once_and_enqueue_once(store: TaskStore) -> None:
    task = make_task()
    assert (await store.create(task))[1] is True
    again, created = await store.create(task)
    assert created is False and again.task_id == task.task_id
    lease = await store.claim("c1", 30, 0.1)
    assert lease is not None and lease.task_id == task.task_id
    assert await store.claim("c2", 30, 0.1) is None


async def test_expired_lease_is_claimed_by_another_consumer_and_renew_prevents_it(store: TaskStore) -> None:
    task = make_task()
    await store.create(task)
    lease = await store.claim("c1", 0.3, 0.1)
    assert lease is not None
    await asyncio.sleep(0.2)
    await store.renew(lease, "c1")
    await asyncio.sleep(0.2)
    assert await store.claim("c2", 0.3, 0.01) is None, "a renewed lease is not taken over"
    await asyncio.sleep(0.4)
    stolen = await store.claim("c2", 0.3, 0.1)
    assert stolen is not None and stolen.task_id == task.task_id
    await store.ack(stolen)
    assert await store.claim("c3", 0.01, 0.05) is None


async def test_update_is_conditional_and_can_enqueue_and_ack_atomically(store: TaskStore) -> None:
    task = make_task()
    await store.create(task)
    lease = await store.claim("c1", 30, 0.1)
    same, changed = await store.update(task.task_id, lambda t: None)
    assert same is not None and changed is False


    updated, changed = await store.update(task.task_id, lambda t: dataclasses.replace(t, attempt=2), enqueue=True,
                                          ack=lease)
    assert changed and updated is not None and updated.attempt == 2
    again = await store.claim("c1", 30, 0.1)
    assert again is not None and lease is not None and again.entry_id != lease.entry_id
    assert await store.update("exp-20260101-0000000000000000", lambda t: t) == (None, False)


async def test_list_pages_newest_first_and_expiry(store: TaskStore) -> None:
    base = time.time()
    tasks = [make_task("lister", base + i) for i in range(7)]
    for task in tasks:
        await store.create(task)
    seen, cursor = [], None
    while True:
        page, cursor = await store.list_tasks("lister", None, 3, cursor)
        seen += [t.task_id for t in page]
        if cursor is None:
            break
    assert seen == [t.task_id for t in reversed(tasks)]


    await store.update(tasks[0].task_id, lambda t: dataclasses.replace(t, status=Status.COMPLETED, expire_at=base - 1))
    assert await store.expired(time.time(), 10) == [tasks[0].task_id]
    assert [t.task_id for t in (await store.list_tasks("lister", Status.COMPLETED, 10, None))[0]] == [tasks[0].task_id]
    await store.delete(tasks[0].task_id)
    assert await store.get(tasks[0].task_id) is None
    assert await store.expired(time.time(), 10) == []
    with pytest.raises(ValueError):
        await store.list_tasks("lister", None, 3, "not-a-cursor")
