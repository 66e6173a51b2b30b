"""The storage interface's promises, checked against both implementations with the same tests."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from backend_stub.config import SchedulerConfig
from backend_stub.models import Task
from backend_stub.store.base import Lease, TaskStore
from backend_stub.store.fair import Fairness
from backend_stub.store.redis_store import RedisTaskStore
from backend_stub.store.sqlite_store import SqliteTaskStore
from exports_common.contract import Status
from exports_common.task_ids import new_task_id
from tests.procs import RedisServer

OpenStore = Callable[..., Awaitable[TaskStore]]


@pytest.fixture(params=["sqlite", "redis"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens a store of the parameter's kind with the scheduler settings given as keywords."""
    opened: list[TaskStore] = []

    async def open_one(**scheduler: Any) -> TaskStore:
        fairness = Fairness(SchedulerConfig(**scheduler))
        if request.param == "redis":
            redis: RedisServer = request.getfixturevalue("redis_server")
            impl: TaskStore = RedisTaskStore(redis.url, f"contract{time.time_ns()}", fairness)
        else:
            impl = SqliteTaskStore(str(tmp_path / f"store{len(opened)}"), fairness)
        await impl.open()
        opened.append(impl)
        return impl

    yield open_one
    for impl in opened:
        await impl.close()


@pytest.fixture
async def store(open_store: OpenStore) -> TaskStore:
    return await open_store()


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
    # margins of 0.25 s around the lease of 0.6 s: a loaded machine oversleeps
    lease = await store.claim("c1", 0.6, 0.1)
    assert lease is not None
    await asyncio.sleep(0.35)
    await store.renew(lease, "c1")
    await asyncio.sleep(0.35)
    assert await store.claim("c2", 0.6, 0.01) is None, "a renewed lease is not taken over"
    await asyncio.sleep(0.7)
    stolen = await store.claim("c2", 0.6, 0.1)
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


async def _queue(store: TaskStore, tenant: str, n: int) -> list[str]:
    tasks = [make_task(tenant) for _ in range(n)]
    for task in tasks:
        await store.create(task)
    return [t.task_id for t in tasks]


async def _claim(store: TaskStore, consumer: str = "c", lease_sec: float = 30) -> Lease:
    lease = await store.claim(consumer, lease_sec, 0.5)
    assert lease is not None, "a task was queued and no tenant is at its cap"
    return lease


async def _owners(store: TaskStore, tenants: dict[str, str], claims: int) -> list[str]:
    """Claim and ack `claims` times; the tenant of each claimed task, in order."""
    order = []
    for _ in range(claims):
        lease = await _claim(store)
        order.append(tenants[lease.task_id])
        await store.ack(lease)
    return order


async def test_a_tenants_long_queue_does_not_delay_another_tenants_task(store: TaskStore) -> None:
    flood = await _queue(store, "a", 200)
    single = await _queue(store, "b", 1)
    first, second = await _claim(store), await _claim(store)
    assert {first.task_id, second.task_id} == {flood[0], single[0]}, "b's task is served in the next turn"
    assert (await _claim(store)).task_id == flood[1], "within a tenant, in the order queued"


async def test_weights_give_proportional_shares(open_store: OpenStore) -> None:
    store = await open_store(weights={"a": 3})
    tenants = {t: "a" for t in await _queue(store, "a", 40)} | {t: "b" for t in await _queue(store, "b", 40)}
    order = await _owners(store, tenants, 40)
    assert order.count("a") == 30 and order.count("b") == 10
    assert all(window.count("b") == 1 for window in (order[i:i + 4] for i in range(0, 40, 4))), order


async def test_an_idle_tenant_earns_no_credit_to_burst_with(store: TaskStore) -> None:
    tenants = {t: "a" for t in await _queue(store, "a", 60)}
    await _owners(store, tenants, 40)
    tenants |= {t: "b" for t in await _queue(store, "b", 20)}
    order = await _owners(store, tenants, 10)
    assert 4 <= order.count("b") <= 6, f"b joins the turns, it does not get 40 in a row: {order}"


async def test_running_cap_skips_the_tenant_without_blocking_others(open_store: OpenStore) -> None:
    store = await open_store(max_running={"a": 2})
    tenants = {t: "a" for t in await _queue(store, "a", 10)} | {t: "b" for t in await _queue(store, "b", 3)}
    leases = [await _claim(store) for _ in range(5)]
    assert [tenants[lease.task_id] for lease in leases] == ["a", "b", "a", "b", "b"]
    assert await store.claim("c", 30, 0.2) is None, "a is at its cap of 2; nobody else has work"
    await store.ack(leases[0])
    assert tenants[(await _claim(store)).task_id] == "a", "an ack frees a's turn"


async def test_a_taken_over_lease_keeps_its_place_under_the_cap_and_its_old_holder_cannot_ack(
        open_store: OpenStore) -> None:
    """A worker that died mid-task (its lease runs out) loses nothing and lets no extra task of its tenant run."""
    store = await open_store(default_max_running=1)
    first, second = await _queue(store, "a", 2)
    dead = await _claim(store, "dead", lease_sec=0.3)
    assert dead.task_id == first
    await asyncio.sleep(0.4)
    taken = await _claim(store, "alive")
    assert taken.task_id == first, "the task of the dead worker, not a second one of the capped tenant"
    await store.ack(dead)
    assert await store.claim("other", 30, 0.2) is None, "the old holder's ack freed nothing: a is still at its cap"
    await store.renew(dead, "dead")
    await asyncio.sleep(0.1)
    assert await store.claim("other", 30, 0.05) is None
    await store.ack(taken)
    assert (await _claim(store)).task_id == second


async def test_a_sqlite_queue_from_before_fair_scheduling_keeps_its_tasks_and_learns_their_tenants(
        tmp_path: Path) -> None:
    first = SqliteTaskStore(str(tmp_path))
    await first.open()
    tasks = [make_task(tenant) for tenant in ("a", "a", "a", "b")]
    for task in tasks:
        await first.create(task)
    # the queue as the version before kept it: no tenant column
    first.db.executescript("DROP INDEX queue_waiting; DROP INDEX queue_leased; ALTER TABLE queue DROP COLUMN tenant")
    await first.close()
    upgraded = SqliteTaskStore(str(tmp_path))
    await upgraded.open()
    order = []
    while (lease := await upgraded.claim("c", 30, 0.01)) is not None:
        order.append(lease.task_id)
        await upgraded.ack(lease)
    await upgraded.close()
    assert order == [tasks[0].task_id, tasks[3].task_id, tasks[1].task_id, tasks[2].task_id]
