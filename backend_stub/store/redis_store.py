"""Shared store: task records in Redis, the queue a Redis Stream with a consumer group.

Several backend processes share one queue. A worker that dies leaves its entry
pending in the group; once the entry has been idle for the lease time another
worker takes it over with XAUTOCLAIM. Live workers renew by re-claiming their
own entry, which resets its idle time. A Redis that lost its data (restarted
without persistence) lost the consumer group too: the first command that finds
it gone (NOGROUP) creates it again.

Every key carries the hash tag `{<prefix>}`: the transactions here span a task's
record and the shared queue and indexes, so on Redis Cluster they must share a
slot. The backend's whole store is then one slot (one shard's worth of load),
which keeps each state change atomic; spreading it needs per-shard queues.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from redis.exceptions import ResponseError, WatchError

from backend_stub.models import Task
from backend_stub.store.base import (
    Change,
    Lease,
    callback_due,
    decode_cursor,
    encode_cursor,
)
from exports_common.contract import Status
from exports_common.redis_client import connect

_GROUP = "workers"
CLAIM_BLOCK_SEC = 1.0
log = logging.getLogger("backend.store")


class RedisTaskStore:
    def __init__(self, url: str, prefix: str) -> None:
        self.redis = connect(url, decode_responses=True)
        # the queue's blocking read waits up to CLAIM_BLOCK_SEC: it gets a client whose timeout allows that
        self.blocking = connect(url, socket_timeout=CLAIM_BLOCK_SEC + 1.0, decode_responses=True)
        self.prefix = "{" + prefix + "}"
        self.stream = f"{self.prefix}:queue"
        self.expiry = f"{self.prefix}:expiry"
        self.callbacks = f"{self.prefix}:callbacks"

    def _task_key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _tenant_key(self, tenant: str) -> str:
        return f"{self.prefix}:tenant:{tenant}"

    def _active_key(self, tenant: str) -> str:
        return f"{self.prefix}:active:{{{tenant}}}"

    async def _track_active(self, before: Task | None, after: Task) -> None:
        """Keep the tenant's set of active task ids in step with a task's change.

        A separate command after the task's own transaction: the set lives in the tenant's
        hash slot, the task in its own. A process killed in between leaves one id wrong
        until the task's next change or its deletion by the janitor.
        """
        was_active = before is not None and not before.terminal
        if after.terminal and was_active:
            await self.redis.srem(self._active_key(after.tenant), after.task_id)
        elif not after.terminal and not was_active:
            await self.redis.sadd(self._active_key(after.tenant), after.task_id)

    async def active_count(self, tenant: str) -> int:
        return int(await self.redis.scard(self._active_key(tenant)))

    async def open(self) -> None:
        await self._create_group()

    async def _create_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, _GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

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
                    pipe.xadd(self.stream, {"task_id": task.task_id})
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
                    if enqueue:
                        pipe.xadd(self.stream, {"task_id": task_id})
                    if ack is not None:
                        pipe.xack(self.stream, _GROUP, ack.entry_id)
                        pipe.xdel(self.stream, ack.entry_id)
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

    async def claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        try:
            return await self._claim(consumer, lease_sec, min(wait_sec, CLAIM_BLOCK_SEC))
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("the queue's consumer group is gone (Redis lost its data); creating it again")
            await self._create_group()
            return None

    async def _claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        lease_ms = int(lease_sec * 1000)
        _, claimed, _ = await self.redis.xautoclaim(self.stream, _GROUP, consumer, lease_ms, "0-0", count=1)
        entries = [(eid, fields) for eid, fields in claimed if fields]
        if not entries:
            reply = cast("list[tuple[str, list[tuple[str, dict[str, str]]]]]", await self.blocking.xreadgroup(
                _GROUP, consumer, {self.stream: ">"}, count=1, block=max(1, int(wait_sec * 1000))
            ))
            entries = reply[0][1] if reply else []
        if not entries:
            return None
        entry_id, fields = entries[0]
        return Lease(entry_id, fields["task_id"], lease_sec)

    async def renew(self, lease: Lease, consumer: str) -> None:
        await self.redis.xclaim(self.stream, _GROUP, consumer, 0, [lease.entry_id], justid=True)

    async def ack(self, lease: Lease) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, _GROUP, lease.entry_id)
            pipe.xdel(self.stream, lease.entry_id)
            await pipe.execute()

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
        async for key in self.redis.scan_iter(match=self._tenant_key("*"), count=500):
            tenant = key[len(self._tenant_key("")):]
            ids = await self.redis.zrange(key, 0, -1)
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
        return bool(await self.redis.ping())
