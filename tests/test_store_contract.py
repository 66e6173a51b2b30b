"""The storage interface's promises, checked against every implementation with the same tests.

SQLite, Redis, and the SQL store on PostgreSQL and on MariaDB (each test a database of its own).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest
import sqlalchemy as sa

from backend_stub import lifecycle
from backend_stub.config import SchedulerConfig
from backend_stub.models import Task
from backend_stub.store.base import ChangeEntry, ChangeLogGap, DeliveryClaim, Lease, TaskStore
from backend_stub.store.fair import Fairness
from backend_stub.store.redis_store import RedisTaskStore
from backend_stub.store.sql_store import SqlTaskStore
from backend_stub.store.sqlite_store import SqliteTaskStore
from exports_common.contract import DeliveryState, Status
from exports_common.task_ids import new_task_id
from tests.databases import SERVERS, SqlDatabase, scratch_database
from tests.procs import RedisServer


class StoreKit:
    """Opens stores of one kind for a test, and closes them at its end."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        self.request = request
        self.tmp_path = tmp_path
        self.opened: list[TaskStore] = []
        self.prefixes: dict[int, str] = {}
        self.urls: dict[int, str] = {}
        self.databases: list[contextlib.AbstractContextManager[SqlDatabase]] = []

    async def __call__(self, change_retention_sec: float = 600, **scheduler: Any) -> TaskStore:
        """A new, empty store with the scheduler settings given as keywords."""
        fairness = Fairness(SchedulerConfig(**scheduler))
        if self.kind == "redis":
            prefix = f"contract{time.time_ns()}"
            impl: TaskStore = RedisTaskStore(self._redis().url, prefix, fairness, change_retention_sec)
            self.prefixes[id(impl)] = prefix
        elif self.kind in SERVERS:
            url = self._database()
            impl = SqlTaskStore(url, fairness, change_retention_sec)
            self.urls[id(impl)] = url
        else:
            impl = SqliteTaskStore(str(self.tmp_path / f"store{len(self.opened)}"), fairness, change_retention_sec)
        return await self._opened(impl)

    async def peer(self, store: TaskStore) -> TaskStore:
        """Another handle on the same store, as a second backend process has one (SQLite: one process owns
        the file, so its one handle is the peer)."""
        if self.kind == "redis":
            return await self._opened(RedisTaskStore(self._redis().url, self.prefixes[id(store)]))
        if self.kind in SERVERS:
            return await self._opened(SqlTaskStore(self.urls[id(store)]))
        return store

    def operations(self, store: TaskStore) -> Callable[[], int]:
        """A counter of the commands or statements the store has sent since this call."""
        if self.kind == "redis":
            client = self._redis().client()

            def commands() -> int:
                return int(client.info("stats")["total_commands_processed"])
            start = commands()
            return lambda: commands() - start - 1  # not counting the INFO that asks
        if isinstance(store, SqlTaskStore):
            sent = [0]

            def counted(*_: Any) -> None:
                sent[0] += 1
            sa.event.listen(store.engine.sync_engine, "before_cursor_execute", counted)
            return lambda: sent[0]
        assert isinstance(store, SqliteTaskStore)
        statements = [0]

        def count(_: str) -> None:
            statements[0] += 1
        store.db.set_trace_callback(count)
        return lambda: statements[0]

    def _database(self) -> str:
        """A new database of this test's own on the machine's server, dropped at the end of the test."""
        database = scratch_database(SERVERS[self.kind], self.request.node.name)
        self.databases.append(database)
        return database.__enter__().url

    def _redis(self) -> RedisServer:
        redis: RedisServer = self.request.getfixturevalue("redis_server")
        return redis

    async def _opened(self, impl: TaskStore) -> TaskStore:
        await impl.open()
        self.opened.append(impl)
        return impl

    async def close(self) -> None:
        for impl in self.opened:
            await impl.close()
        for database in reversed(self.databases):
            database.__exit__(None, None, None)


OpenStore = StoreKit


@pytest.fixture(params=["sqlite", "redis", *sorted(SERVERS)])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreKit]:
    kit = StoreKit(request.param, request, tmp_path)
    yield kit
    await kit.close()


@pytest.fixture
async def store(open_store: StoreKit) -> TaskStore:
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


# -- the change log -----------------------------------------------------------------------------------


def _step(step: str, progress: int = 0) -> Callable[[Task], Task]:
    return lambda t: dataclasses.replace(t, status=Status.RUNNING, current_step=step, progress=progress)


async def _log(store: TaskStore, after: str | None = None) -> list[ChangeEntry]:
    return await store.changes(after, 1000)


async def test_every_change_appends_an_entry_holding_the_task_as_the_status_endpoint_answers_it(
        store: TaskStore) -> None:
    task, _ = await store.create(make_task("logged"))
    running, _ = await store.update(task.task_id, _step("query", 10))
    rendered, _ = await store.update(task.task_id, _step("render", 60))
    done, _ = await store.update(task.task_id, lifecycle.finish(Status.COMPLETED))
    await store.update(task.task_id, lambda t: None)  # no change, no entry
    records = [task, running, rendered, done]
    assert all(r is not None for r in records)
    entries = await _log(store)
    assert [e.change_id for e in entries] == [r.change_id for r in records if r is not None]
    assert [e.task for e in entries] == [r.public() for r in records if r is not None]
    assert [e.task["status"] for e in entries] == ["PENDING", "RUNNING", "RUNNING", "COMPLETED"]
    assert {(e.task_id, e.tenant) for e in entries} == {(task.task_id, "logged")}
    ids = [e.change_id for e in entries]
    assert ids == sorted(ids) and len(set(ids)) == 4 and len({len(i) for i in ids}) == 1, \
        "distinct ids of one length, in log order as strings"
    stored = await store.get(task.task_id)
    assert stored is not None and stored.change_id == ids[-1] == await store.latest_change_id()


async def test_after_returns_the_entries_strictly_after_it_in_pages(store: TaskStore) -> None:
    assert await store.latest_change_id() is None and await _log(store) == []
    for _ in range(5):
        await store.create(make_task())
    entries = await _log(store)
    pages: list[ChangeEntry] = []
    after = None
    while page := await store.changes(after, 2):
        assert len(page) <= 2
        pages += page
        after = page[-1].change_id
    assert pages == entries and len(entries) == 5
    assert await _log(store, entries[1].change_id) == entries[2:]
    assert await _log(store, entries[-1].change_id) == []
    for garbage in ("", "not-an-id", "1", entries[0].change_id + "0"):
        with pytest.raises(ValueError):
            await store.changes(garbage, 10)


async def test_one_task_resumes_from_the_change_id_of_its_record(store: TaskStore) -> None:
    """A consumer that has a task's state (with its change_id) reads on from there and misses nothing newer."""
    followed, _ = await store.create(make_task())
    other, _ = await store.create(make_task())
    seen = await store.get(followed.task_id)
    assert seen is not None
    await store.update(followed.task_id, _step("query"))
    await store.update(other.task_id, _step("query"))
    await store.update(followed.task_id, lifecycle.finish(Status.COMPLETED))
    later = [e for e in await _log(store, seen.change_id) if e.task_id == followed.task_id]
    assert [e.task["status"] for e in later] == ["RUNNING", "COMPLETED"]
    assert all(e.change_id > seen.change_id for e in later), "an entry older than a state can be told by its id"
    final = await store.get(followed.task_id)
    assert final is not None and final.change_id == later[-1].change_id


async def test_the_log_keeps_the_retention_and_reading_after_trimmed_entries_is_a_gap(open_store: StoreKit) -> None:
    store = await open_store(change_retention_sec=0.5)
    for _ in range(3):
        await store.create(make_task())
    old = await _log(store)
    await asyncio.sleep(0.7)
    assert await store.trim_changes() == 3
    await store.create(make_task())
    new = await _log(store)
    assert len(new) == 1 and await store.trim_changes() == 0, "an entry younger than the retention stays"
    for lost in old[:2]:
        with pytest.raises(ChangeLogGap):
            await store.changes(lost.change_id, 10)
    assert await _log(store, old[2].change_id) == new, "nothing after the newest trimmed entry was lost"
    entries, age = await store.change_log_stats()
    assert entries == 1 and age is not None and 0 <= age < 5
    with pytest.raises(ChangeLogGap):
        await (await open_store()).changes(new[0].change_id, 10)  # a log that never issued it: lost its data


async def test_a_wait_returns_at_once_on_a_new_entry_and_empty_after_wait_sec_without_polling(
        open_store: StoreKit) -> None:
    store = await open_store()
    writer = await open_store.peer(store)
    task, _ = await writer.create(make_task())
    after = await store.latest_change_id()
    sent = open_store.operations(store)
    started = time.monotonic()
    assert await store.changes(after, 10, wait_sec=1.5) == []
    waited = time.monotonic() - started
    assert 1.5 <= waited < 3.0, waited
    # a few reads and blocking waits (on Redis, a script's own commands count too); polling makes hundreds
    assert sent() <= 40, f"{sent()} operations in a 1.5 s wait: that is polling"

    waiter = asyncio.create_task(store.changes(after, 10, wait_sec=10))
    await asyncio.sleep(0.3)
    assert not waiter.done()
    written, _ = await writer.update(task.task_id, _step("query"))
    wrote_at = time.monotonic()
    woken = await asyncio.wait_for(waiter, 5)
    assert written is not None and [e.change_id for e in woken] == [written.change_id]
    assert time.monotonic() - wrote_at < 0.5, "woken by the write, not at the end of the wait"


async def test_two_concurrent_writers_entries_are_seen_in_id_order_and_none_is_missed(open_store: StoreKit) -> None:
    first = await open_store()
    second = await open_store.peer(first)
    tasks = [(await first.create(make_task()))[0], (await second.create(make_task()))[0]]
    start = await first.latest_change_id()
    steps = 60

    async def write(handle: TaskStore, task: Task) -> None:
        for i in range(steps):
            await handle.update(task.task_id, _step(f"s{i:02d}"))

    writers = asyncio.gather(write(first, tasks[0]), write(second, tasks[1]))
    seen: list[ChangeEntry] = []
    after = start
    deadline = time.monotonic() + 30
    while len(seen) < 2 * steps and time.monotonic() < deadline:
        for entry in await first.changes(after, 7, wait_sec=0.5):
            assert after is None or entry.change_id > after, "a new entry with an id at or below one seen"
            after = entry.change_id
            seen.append(entry)
    await writers
    assert len(seen) == 2 * steps and await first.changes(after, 10) == []
    for task in tasks:
        assert [e.task["current_step"] for e in seen if e.task_id == task.task_id] == \
            [f"s{i:02d}" for i in range(steps)]


# -- callback delivery claims -------------------------------------------------------------------------

DELAYS = [0.3, 0.3]


async def _notified(store: TaskStore) -> Task:
    """A finished task whose first notification is due now."""
    task = dataclasses.replace(make_task("hooked"), callback_url="http://127.0.0.1:9/hook")
    await store.create(task)
    done, _ = await store.update(task.task_id, lifecycle.finish(Status.COMPLETED))
    assert done is not None and done.callback is not None and done.callback["seq"] == 1
    assert await _due(store) == [task.task_id], "due at once"
    return done


async def _due(store: TaskStore) -> list[str]:
    return await store.due_callbacks(time.time(), 100)


async def _claimed(open_store: StoreKit, holder: str, lease_sec: float = 30
                   ) -> tuple[TaskStore, TaskStore, Task, DeliveryClaim]:
    """Two handles on one store (as two backends have) and a notified task whose delivery `holder` claimed."""
    store = await open_store()
    other = await open_store.peer(store)
    task = await _notified(store)
    claim = await store.claim_callback(task.task_id, holder, lease_sec)
    assert claim is not None
    return store, other, task, claim


async def test_a_due_delivery_is_claimed_by_one_holder_once_per_notification(open_store: StoreKit) -> None:
    store, other, task, claim = await _claimed(open_store, "a")
    assert (claim.seq, claim.holder, claim.taken_over) == (1, "a", False)
    assert claim.task.callback == task.callback, "the claim carries what to deliver"
    assert await other.claim_callback(task.task_id, "b", 30) is None, "held by a"
    again = await store.claim_callback(task.task_id, "a", 30)
    assert again is not None and again.seq == 1, "a retried call of the holder gets its claim"
    assert await _due(other) == [], "not due while claimed"

    delivered, changed = await store.update(task.task_id, lifecycle.callback_attempted(1, None, DELAYS), claim=claim)
    assert changed and delivered is not None and delivered.callback is not None
    assert delivered.callback["state"] == DeliveryState.DELIVERED
    assert await other.claim_callback(task.task_id, "b", 30) is None, "delivered: nothing left to claim"

    renotified, _ = await store.update(task.task_id, lambda t: lifecycle.notify(t, time.time()))
    assert renotified is not None
    second = await other.claim_callback(task.task_id, "b", 30)
    assert second is not None and second.seq == 2, "the next notification is claimed anew"


async def test_a_claim_that_ran_out_is_taken_over_and_its_old_holder_is_fenced(open_store: StoreKit) -> None:
    store, other, task, dead = await _claimed(open_store, "dead", lease_sec=0.3)
    await asyncio.sleep(0.5)
    assert await _due(other) == [task.task_id], "due again once the claim ran out"
    alive = await other.claim_callback(task.task_id, "alive", 30)
    assert alive is not None and alive.taken_over and alive.seq == 1

    stale, changed = await store.update(task.task_id, lifecycle.callback_attempted(1, None, DELAYS), claim=dead)
    assert not changed and stale is not None and stale.callback is not None
    assert (stale.callback["state"], stale.callback["attempts"]) == (DeliveryState.PENDING, 0)
    done, changed = await other.update(task.task_id, lifecycle.callback_attempted(1, None, DELAYS), claim=alive)
    assert changed and done is not None and done.callback is not None
    assert done.callback["state"] == DeliveryState.DELIVERED


async def test_a_failed_try_releases_the_claim_and_the_retry_is_claimed_when_due(open_store: StoreKit) -> None:
    store, other, task, first = await _claimed(open_store, "a")
    await store.update(task.task_id, lifecycle.callback_attempted(1, "the receiver answered 500", DELAYS), claim=first)
    assert await other.claim_callback(task.task_id, "b", 30) is None, "the retry is not due yet"
    await asyncio.sleep(0.4)
    retry = await other.claim_callback(task.task_id, "b", 30)
    assert retry is not None and retry.seq == 1 and not retry.taken_over, "released, not run out"
    assert retry.task.callback is not None and retry.task.callback["attempts"] == 1


async def test_a_newer_notification_waits_for_the_claimed_one_and_fences_its_outcome(open_store: StoreKit) -> None:
    """Deliveries of one task are claimed one at a time; an outcome of a replaced notification changes nothing."""
    store, other, task, first = await _claimed(open_store, "a")
    await other.update(task.task_id, lambda t: lifecycle.notify(t, time.time()))  # an operator's redeliver
    assert await other.claim_callback(task.task_id, "b", 30) is None, "seq 1 is still being delivered"
    current, changed = await store.update(task.task_id, lifecycle.callback_attempted(1, None, DELAYS), claim=first)
    assert not changed and current is not None and current.callback is not None
    assert (current.callback["seq"], current.callback["state"]) == (2, DeliveryState.PENDING)
    assert await _due(other) == [task.task_id]
    second = await other.claim_callback(task.task_id, "b", 30)
    assert second is not None and second.seq == 2


async def test_a_type_definition_is_kept_under_its_digest_once_and_read_back(open_store: OpenStore) -> None:
    store = await open_store()
    other = await open_store.peer(store)
    assert await store.type_definition("d1") is None
    await store.put_type_definition("d1", '{"source": {"kind": "synthetic"}}')
    await other.put_type_definition("d1", '{"source": {"kind": "synthetic"}}')  # again, from another backend
    assert await other.type_definition("d1") == '{"source": {"kind": "synthetic"}}'
    assert await store.type_definition("d2") is None
