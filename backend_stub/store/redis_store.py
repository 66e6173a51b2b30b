"""Shared store: task records in Redis, the queue a list per tenant served in fair turns.

Several backend processes share one queue. Its parts (see `scheduler_scripts`): a list of
entries per tenant, a sorted set of the tenants with queued entries ordered by their pass
(backend_stub.store.fair), and the leases: a sorted set of leased entries by deadline, their
holders and tenants, and a count of leases per tenant (the running cap). A claim is one Lua
script, so two workers never take the same entry and a tenant's count is never off: it takes
over a lease that ran out (its worker died or stalled), or else pops the next tenant's entry.
Live workers renew their own lease; a worker whose lease was taken over can neither renew nor
ack it any more. Idle workers wait on a list of wake-up tokens that every enqueue and ack
pushes to, instead of polling.

Every key carries the hash tag `{<prefix>}`: the transactions here span a task's record and the
shared queue and indexes, and a claim chooses among all tenants at once (a global scheduler reads
every tenant's place in line in one atomic step), so on Redis Cluster they must share a slot. The
backend's whole store is then one slot (one shard's worth of load), which keeps each state change
atomic; spreading it needs per-shard queues. The scripts build each tenant's list key from the
prefix they are given (as BullMQ does): it starts with the same tag, so it is in the same slot.
Nothing here scans the key space: the metrics read the tenants from an index kept with the tasks.
"""
from __future__ import annotations

import logging
import time
from typing import Any, cast

from redis.exceptions import WatchError

from backend_stub.models import Task
from backend_stub.store import scheduler_scripts as lua
from backend_stub.store.base import (
    Change,
    Lease,
    callback_due,
    decode_cursor,
    encode_cursor,
)
from backend_stub.store.fair import Fairness
from exports_common.contract import Status
from exports_common.redis_client import connect

CLAIM_BLOCK_SEC = 1.0
log = logging.getLogger("backend.store")


class RedisTaskStore:
    def __init__(self, url: str, prefix: str, fairness: Fairness | None = None) -> None:
        self.redis = connect(url, decode_responses=True)
        # an idle worker's wait lasts up to CLAIM_BLOCK_SEC: it gets a client whose timeout allows that
        self.blocking = connect(url, socket_timeout=CLAIM_BLOCK_SEC + 1.0, decode_responses=True)
        self.prefix = "{" + prefix + "}"
        self.expiry = f"{self.prefix}:expiry"
        self.callbacks = f"{self.prefix}:callbacks"
        self.queue = lua.QueueKeys(self.prefix)
        self._fair_args = (fairness or Fairness()).script_args()
        self._claim = self.redis.register_script(lua.CLAIM)
        self._renew = self.redis.register_script(lua.RENEW)
        self.tenants = f"{self.prefix}:tenants"  # every tenant that ever had a task here: a few per customer

    def _task_key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _tenant_key(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{tenant}"

    def _active_key(self, tenant: str) -> str:
        return f"{self.prefix}:active:{{{tenant}}}"

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
        """Nothing to set up: the queue's keys appear with their first entry."""

    async def close(self) -> None:
        await self.redis.aclose()
        await self.blocking.aclose()

    def _stage_write(self, pipe: Any, task: Task) -> None:
        pipe.set(self._task_key(task.task_id), task.to_json())
        if task.terminal and task.expire_at is not None:
            pipe.zadd(self.expiry, {task.task_id: task.expire_at})
        else:
            pipe.zrem(self.expiry, task.task_id)
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
                    await pipe.execute()
                    await self._track_active(None, task)
                    return task, True
                except WatchError:
                    continue

    async def get(self, task_id: str) -> Task | None:
        raw = await self.redis.get(self._task_key(task_id))
        return Task.from_json(raw) if raw is not None else None

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None
    ) -> tuple[Task | None, bool]:
        key = self._task_key(task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None, False
                    current = Task.from_json(raw)
                    new = change(current)
                    if new is None:
                        return current, False
                    pipe.multi()
                    self._stage_write(pipe, new)
                    if ack is not None:
                        self._stage_ack(pipe, ack)
                    if enqueue:
                        self._stage_enqueue(pipe, new)
                    await pipe.execute()
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
        deadline = time.monotonic() + min(wait_sec, CLAIM_BLOCK_SEC)
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

    async def delete(self, task_id: str) -> None:
        task = await self.get(task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._task_key(task_id))
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

    async def ping(self) -> bool:
        # a read in the store's slot: on a Redis Cluster it reaches the node holding the store, where a
        # PING would go to any node and call the backend ready while its store is gone
        await self.redis.exists(self.queue.ready)
        return True
