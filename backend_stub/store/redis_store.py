"""Shared store: task records in Redis, the queue a list per tenant served in fair turns.

Several backend processes share one queue. Its parts (see `scheduler_scripts`): a list of
entries per tenant, a sorted set of the tenants with queued entries ordered by their pass
(backend_stub.store.fair), and the leases: a sorted set of leased entries by deadline, their
holders and tenants, and a count of leases per tenant (the running cap). A claim is one Lua
script, so two workers never take the same entry and a tenant's count is never off: it takes
over a lease that ran out (its worker died or stalled), or else pops the next tenant's entry.
Live workers renew their own lease; a worker whose lease was taken over can neither renew nor
ack it any more. Idle workers wait on a list of wake-up tokens that every enqueue and ack
pushes to, instead of polling. Every record write appends to the change log, a stream, in the
same step, and callback deliveries are claimed per task (see `record_scripts`); readers of the
log wait on the stream itself (XREAD BLOCK).

Every key carries the hash tag `{<prefix>}`: the transactions here span a task's record and the
shared queue and indexes, and a claim chooses among all tenants at once (a global scheduler reads
every tenant's place in line in one atomic step), so on Redis Cluster they must share a slot. The
backend's whole store is then one slot (one shard's worth of load), which keeps each state change
atomic; spreading it needs per-shard queues. The scripts build each tenant's list key from the
prefix they are given (as BullMQ does): it starts with the same tag, so it is in the same slot.
Nothing here scans the key space: the metrics read the tenants from an index kept with the tasks.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, cast

from redis.exceptions import WatchError

from backend_stub.models import Task
from backend_stub.store import record_scripts as records
from backend_stub.store import scheduler_scripts as lua
from backend_stub.store.base import (
    Change,
    ChangeEntry,
    ChangeLogGap,
    DeliveryClaim,
    Lease,
    callback_due,
    decode_cursor,
    encode_cursor,
    page_size,
)
from backend_stub.store.fair import Fairness
from exports_common.contract import Status
from exports_common.redis_client import connect, learn_cluster

BLOCK_SEC = 1.0
log = logging.getLogger("backend.store")


class RedisTaskStore:
    def __init__(self, url: str, prefix: str, fairness: Fairness | None = None,
                 change_retention_sec: float = 600) -> None:
        self.redis = connect(url, decode_responses=True)
        # an idle worker's or change reader's wait lasts up to BLOCK_SEC: it gets a client whose timeout allows that
        self.blocking = connect(url, socket_timeout=BLOCK_SEC + 1.0, decode_responses=True)
        self.prefix = "{" + prefix + "}"
        self.expiry = f"{self.prefix}:expiry"
        self.callbacks = f"{self.prefix}:callbacks"
        self.changes_key = f"{self.prefix}:changes"
        self.trimmed_key = f"{self.prefix}:changes:trimmed"
        self.change_retention_sec = change_retention_sec
        self.queue = lua.QueueKeys(self.prefix)
        self._fair_args = (fairness or Fairness()).script_args()
        self._claim = self.redis.register_script(lua.CLAIM)
        self._renew = self.redis.register_script(lua.RENEW)
        self._read_changes = self.redis.register_script(records.READ)
        self._latest_change = self.redis.register_script(records.LATEST)
        self._trim_changes = self.redis.register_script(records.TRIM)
        self._claim_callback = self.redis.register_script(records.CLAIM_CALLBACK)
        self._drop_definition = self.redis.register_script(records.DROP_DEFINITION)
        self.definitions = f"{self.prefix}:type_definitions"  # digest -> when last recorded
        self.tenants = f"{self.prefix}:tenants"  # every tenant that ever had a task here: a few per customer

    def _task_key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _tenant_key(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{tenant}"

    def _active_key(self, tenant: str) -> str:
        return f"{self.prefix}:active:{{{tenant}}}"

    def _claim_key(self, task_id: str) -> str:
        return f"{self.prefix}:callback_claim:{task_id}"

    async def _track_active(self, before: Task | None, after: Task) -> None:
        """Keep the tenant's set of active task ids in step with a task's change.

        A separate command after the task's own transaction (the set is in the store's slot,
        its `{tenant}` is not a hash tag, so it could join it). A process killed in between
        leaves one id wrong until the task's next change or its deletion by the janitor.
        """
        was_active = before is not None and not before.terminal
        if after.terminal and was_active:
            await self.redis.srem(self._active_key(after.tenant), after.task_id)
        elif not after.terminal and not was_active:
            await self.redis.sadd(self._active_key(after.tenant), after.task_id)

    async def active_count(self, tenant: str) -> int:
        return int(await self.redis.scard(self._active_key(tenant)))

    async def open(self) -> None:
        """Nothing to set up but a cluster's map: the queue's keys appear with their first entry."""
        await learn_cluster(self.redis)
        await learn_cluster(self.blocking)

    async def close(self) -> None:
        await self.redis.aclose()
        await self.blocking.aclose()

    def _stage_write(self, pipe: Any, task: Task) -> None:
        """The record and its change-log entry (staged first: the transaction's first result is the change id)."""
        before, after = task.json_around_change_id()
        # EVAL, not EVALSHA: inside MULTI a missing script could not be loaded and retried
        pipe.eval(records.RECORD, 2, self._task_key(task.task_id), self.changes_key, before, after, task.task_id,
                  task.tenant, json.dumps(task.public(), separators=(",", ":")))
        if task.terminal and task.expire_at is not None:
            pipe.zadd(self.expiry, {task.task_id: task.expire_at})
        else:
            pipe.zrem(self.expiry, task.task_id)
        self._stage_callback_due(pipe, task)

    def _stage_callback_due(self, pipe: Any, task: Task) -> None:
        due = callback_due(task)
        if due is not None:
            pipe.zadd(self.callbacks, {task.task_id: due})
        else:
            pipe.zrem(self.callbacks, task.task_id)

    async def create(self, task: Task) -> tuple[Task, bool]:
        key = self._task_key(task.task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is not None:
                        return Task.from_json(raw), False
                    pipe.multi()
                    self._stage_write(pipe, task)
                    pipe.zadd(self._tenant_key(task.tenant), {task.task_id: task.created_at})
                    pipe.sadd(self.tenants, task.tenant)
                    self._stage_enqueue(pipe, task)
                    written = dataclasses.replace(task, change_id=(await pipe.execute())[0])
                    await self._track_active(None, written)
                    return written, True
                except WatchError:
                    continue

    async def get(self, task_id: str) -> Task | None:
        raw = await self.redis.get(self._task_key(task_id))
        return Task.from_json(raw) if raw is not None else None

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None,
        claim: DeliveryClaim | None = None,
    ) -> tuple[Task | None, bool]:
        key = self._task_key(task_id)
        watched = [key] if claim is None else [key, self._claim_key(task_id)]
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(*watched)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None, False
                    current = Task.from_json(raw)
                    if claim is not None and not records.claim_value_holds(
                            cast("str | None", await pipe.get(self._claim_key(task_id))), claim.seq, claim.holder):
                        return current, False  # taken over: the new holder records the outcome
                    new = change(current)
                    if new is None and claim is None:
                        return current, False
                    pipe.multi()
                    if new is not None:
                        self._stage_write(pipe, new)
                    else:  # released: due again when the record says, not when the claim said
                        self._stage_callback_due(pipe, current)
                    if claim is not None:
                        pipe.delete(self._claim_key(task_id))
                    if ack is not None:
                        self._stage_ack(pipe, ack)
                    if enqueue and new is not None:
                        self._stage_enqueue(pipe, new)
                    results = await pipe.execute()
                    if new is None:
                        return current, False
                    new = dataclasses.replace(new, change_id=results[0])
                    await self._track_active(current, new)
                    return new, True
                except WatchError:
                    continue

    async def list_tasks(
        self, tenant: str, status: str | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        after = decode_cursor(cursor) if cursor else None
        max_score: str | float = after[0] if after else "+inf"
        out: list[Task] = []
        offset, batch = 0, max(limit * 2, 100)
        while len(out) <= limit:
            # redis-py types every reply as a union; with decode_responses the shape is known
            ids = cast("list[tuple[str, float]]", await self.redis.zrevrangebyscore(
                self._tenant_key(tenant), max_score, "-inf", start=offset, num=batch, withscores=True
            ))
            if not ids:
                break
            offset += len(ids)
            candidates = [
                tid for tid, score in ids if after is None or score < after[0] or (score == after[0] and tid < after[1])
            ]
            raws = await self.redis.mget([self._task_key(t) for t in candidates]) if candidates else []
            tasks = [Task.from_json(r) for r in raws if r is not None]
            # the index is ordered by score only; equal scores are ordered by id here
            tasks.sort(key=lambda t: (t.created_at, t.task_id), reverse=True)
            out += [t for t in tasks if status is None or t.status == status]
        out.sort(key=lambda t: (t.created_at, t.task_id), reverse=True)
        page = out[:limit]
        more = len(out) > limit
        return page, encode_cursor(page[-1].created_at, page[-1].task_id) if more else None

    def _stage_enqueue(self, pipe: Any, task: Task) -> None:
        # EVAL, not EVALSHA: inside MULTI a missing script could not be loaded and retried
        q = self.queue
        pipe.eval(lua.ENQUEUE, 5, q.ready, q.passes, q.vtime, q.seq, q.wake, q.tenant_prefix, task.tenant,
                  task.task_id)

    def _ack_keys_args(self, lease: Lease) -> list[str]:
        q = self.queue
        return [q.leases, q.leased, q.running, q.wake, lease.entry_id, lease.owner]

    def _stage_ack(self, pipe: Any, lease: Lease) -> None:
        pipe.eval(lua.ACK, 4, *self._ack_keys_args(lease))

    async def claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        q = self.queue
        keys = [q.ready, q.passes, q.vtime, q.leases, q.leased, q.running]
        args = [q.tenant_prefix, consumer, int(lease_sec * 1000), *self._fair_args]
        deadline = time.monotonic() + min(wait_sec, BLOCK_SEC)
        while True:
            entry = await self._claim(keys, args)
            if entry:
                return Lease(entry, entry.split("|", 1)[1], lease_sec, consumer)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # woken by the next enqueue or ack (a tenant at its cap may have a turn again)
            await self.blocking.blpop([q.wake], timeout=max(remaining, 0.01))

    async def renew(self, lease: Lease, consumer: str) -> None:
        q = self.queue
        await self._renew([q.leases, q.leased], [lease.entry_id, consumer, int(lease.lease_sec * 1000)])

    async def ack(self, lease: Lease) -> None:
        await self.redis.eval(lua.ACK, 4, *self._ack_keys_args(lease))

    async def expired(self, now: float, limit: int) -> list[str]:
        return cast("list[str]", await self.redis.zrangebyscore(self.expiry, "-inf", now, start=0, num=limit))

    async def due_callbacks(self, now: float, limit: int) -> list[str]:
        return cast("list[str]", await self.redis.zrangebyscore(self.callbacks, "-inf", now, start=0, num=limit))

    async def claim_callback(self, task_id: str, holder: str, lease_sec: float) -> DeliveryClaim | None:
        now = time.time()
        claimed = await self._claim_callback(
            [self._claim_key(task_id), self._task_key(task_id), self.callbacks],
            [task_id, holder, int(lease_sec * 1000), repr(now), repr(now + lease_sec)])
        if not claimed:
            return None
        raw, taken_over = claimed
        task = Task.from_json(raw)
        assert task.callback is not None  # the script claims only a pending notification
        return DeliveryClaim(task_id, int(task.callback["seq"]), holder, task, taken_over=bool(taken_over))

    async def changes(self, after: str | None, limit: int, wait_sec: float = 0.0) -> list[ChangeEntry]:
        start = records.stream_id(after) if after is not None else ""
        page = page_size(limit)
        deadline = time.monotonic() + wait_sec
        while True:
            found = await self._read_changes([self.changes_key, self.trimmed_key], [start, page])
            if found is None:
                raise ChangeLogGap(after)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return [_entry(entry_id, fields) for entry_id, fields in found]
            # woken by the next entry; XREAD's id is exclusive, as `after` is
            await self.blocking.xread({self.changes_key: start or "0-0"}, count=1,
                                      block=max(1, int(min(remaining, BLOCK_SEC) * 1000)))

    async def latest_change_id(self) -> str | None:
        latest = await self._latest_change([self.changes_key])
        return records.change_id(latest) if latest else None

    async def trim_changes(self) -> int:
        return int(await self._trim_changes([self.changes_key, self.trimmed_key],
                                            [int(self.change_retention_sec * 1000)]))

    async def change_log_stats(self) -> tuple[int, float | None]:
        length = await self.redis.xlen(self.changes_key)
        oldest = cast("list[tuple[str, dict[str, str]]]", await self.redis.xrange(self.changes_key, "-", "+", count=1))
        if not oldest:
            return int(length), None
        # an entry id starts with its time in ms (Redis's clock)
        return int(length), max(0.0, time.time() - int(oldest[0][0].partition("-")[0]) / 1000)

    async def delete(self, task_id: str) -> None:
        task = await self.get(task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._task_key(task_id))
            pipe.delete(self._claim_key(task_id))
            pipe.zrem(self.expiry, task_id)
            pipe.zrem(self.callbacks, task_id)
            if task is not None:
                pipe.zrem(self._tenant_key(task.tenant), task_id)
            await pipe.execute()
        if task is not None:
            await self.redis.srem(self._active_key(task.tenant), task_id)

    async def task_counts(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """Read from the tenant indexes and the records: a scrape's cost grows with the tasks kept."""
        counts: dict[tuple[str, str], int] = {}
        oldest: dict[str, float] = {}
        for tenant in cast("set[str]", await self.redis.smembers(self.tenants)):
            ids = await self.redis.zrange(self._tenant_key(tenant), 0, -1)
            for start in range(0, len(ids), 500):
                for raw in await self.redis.mget([self._task_key(str(t)) for t in ids[start:start + 500]]):
                    if raw is None:
                        continue
                    task = Task.from_json(raw)
                    counts[(tenant, task.status)] = counts.get((tenant, task.status), 0) + 1
                    if task.status == Status.PENDING:
                        oldest[tenant] = min(oldest.get(tenant, task.created_at), task.created_at)
        return counts, oldest

    async def put_type_definition(self, digest: str, definition: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._definition_key(digest), definition, nx=True)
            pipe.zadd(self.definitions, {digest: time.time()})
            await pipe.execute()

    def _definition_key(self, digest: str) -> str:
        return f"{self.prefix}:type_definition:{digest}"

    async def drop_unused_type_definitions(self, recorded_before: float) -> int:
        """Reads every task record (as `task_counts` does): the janitor runs it seldom."""
        candidates = await self.redis.zrangebyscore(self.definitions, "-inf", f"({recorded_before}")
        if not candidates:
            return 0
        named: set[str] = set()
        for tenant in cast("set[str]", await self.redis.smembers(self.tenants)):
            ids = await self.redis.zrange(self._tenant_key(tenant), 0, -1)
            for start in range(0, len(ids), 500):
                for raw in await self.redis.mget([self._task_key(str(t)) for t in ids[start:start + 500]]):
                    if raw is not None:
                        named.add(Task.from_json(raw).type_digest)
        dropped = 0
        for digest in map(str, candidates):
            if digest not in named:  # the script keeps it if it was recorded again since (a task on its way)
                dropped += int(await self._drop_definition(keys=[self.definitions, self._definition_key(digest)],
                                                           args=[digest, recorded_before]))
        return dropped

    async def type_definition(self, digest: str) -> str | None:
        found = await self.redis.get(self._definition_key(digest))
        return str(found) if found is not None else None

    async def ping(self) -> bool:
        # a read in the store's slot: on a Redis Cluster it reaches the node holding the store, where a
        # PING would go to any node and call the backend ready while its store is gone
        await self.redis.exists(self.queue.ready)
        return True


def _entry(stream_id: str, fields: list[str]) -> ChangeEntry:
    """A stream entry as the READ script returns it: its id and a flat list of field names and values."""
    values = dict(zip(fields[::2], fields[1::2], strict=True))
    return ChangeEntry(records.change_id(stream_id), values["task_id"], values["tenant"], json.loads(values["task"]))
