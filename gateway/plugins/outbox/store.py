"""The outbox: submissions accepted while the upstream was down, kept durably and delivered in order.

A local SQLite file by default (nothing lost across a gateway restart), Redis when
configured (shared by the gateway processes; a lock lets one of them drain at a
time, which keeps the order). Redelivery is safe: the backend's create is
idempotent by task id. In Redis every outbox key carries one hash tag, so the
outbox lives in one Redis Cluster slot and its scripts and transactions are legal there.
"""
from __future__ import annotations

import base64
import json
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from redis.asyncio.lock import Lock
from redis.exceptions import LockNotOwnedError

from exports_common.redis_client import AnyRedis

# a deferred item keeps its place: the drain looks this far down the order for one that is due
DUE_WINDOW = 100
# how long a submission the upstream refused stays readable (as a FAILED task) on its status route
REFUSED_KEEP_SEC = 7 * 86_400
# how long the outbox remembers that a task left it (delivered or refused): far longer than any status read
# takes, so a read whose upstream 404 came before the delivery learns to ask again (see `left_lately`)
LEFT_KEEP_SEC = 600


@dataclass(frozen=True)
class OutboxItem:
    task_id: str
    tenant: str
    upstream: str
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: str  # base64
    created_at: float
    # set once the upstream refused it for good: the task's error (TaskError's fields), kept for its status route
    error: dict[str, Any] | None = None
    # refusals for now (429, 503...) so far, and the unix time before which it is not tried again
    deferrals: int = 0
    not_before: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> OutboxItem:
        data = json.loads(raw)
        data["headers"] = [tuple(h) for h in data["headers"]]
        return cls(**data)

    @property
    def body_bytes(self) -> bytes:
        return base64.b64decode(self.body)


class OutboxStore(Protocol):
    async def put(self, item: OutboxItem) -> None: ...

    async def find(self, tenant: str, task_id: str) -> OutboxItem | None: ...

    async def oldest(self, now: float) -> OutboxItem | None:
        """The first item in order that is due at `now`, among the first `DUE_WINDOW` (None: none is)."""

    async def defer(self, item: OutboxItem) -> None:
        """Store `item`'s new `deferrals` and `not_before`; it keeps its place in the order."""

    async def remove(self, task_id: str) -> None:
        """Take the item out of the order (delivered, or refused), remembered `LEFT_KEEP_SEC` for `left_lately`."""

    async def left_lately(self, task_id: str) -> bool:
        """Whether the item left the outbox within `LEFT_KEEP_SEC`: an upstream 404 read before then may be stale."""

    async def refuse(self, item: OutboxItem) -> None:
        """Take `item` (its `error` set) out of the order, kept `REFUSED_KEEP_SEC` for `find`."""

    async def size(self) -> int: ...

    async def tenant_size(self, tenant: str) -> int: ...

    async def lock(self, owner: str, ttl: float) -> bool:
        """Take or extend the right to drain; False while another process holds it."""

    async def unlock(self, owner: str) -> None:
        """Give up the right to drain, if `owner` holds it, so a process that can deliver takes it."""


class SqliteOutbox:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                        "task_id TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL, item TEXT NOT NULL)")
        self.db.execute("CREATE INDEX IF NOT EXISTS outbox_by_tenant ON outbox (tenant)")
        self.db.execute("CREATE TABLE IF NOT EXISTS outbox_refused (task_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
                        "item TEXT NOT NULL, refused_at REAL NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS outbox_left (task_id TEXT PRIMARY KEY, left_at REAL NOT NULL)")

    async def put(self, item: OutboxItem) -> None:
        self.db.execute("INSERT OR IGNORE INTO outbox (task_id, tenant, item) VALUES (?,?,?)",
                        (item.task_id, item.tenant, item.to_json()))

    async def find(self, tenant: str, task_id: str) -> OutboxItem | None:
        row = self.db.execute("SELECT item FROM outbox WHERE task_id = ? AND tenant = ?", (task_id, tenant)).fetchone()
        if row is None:
            row = self.db.execute("SELECT item FROM outbox_refused WHERE task_id = ? AND tenant = ? AND refused_at > ?",
                                  (task_id, tenant, time.time() - REFUSED_KEEP_SEC)).fetchone()
        return OutboxItem.from_json(row[0]) if row else None

    async def refuse(self, item: OutboxItem) -> None:
        now = time.time()
        with self.db:  # one transaction: the item is never in neither table
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM outbox_refused WHERE refused_at <= ?", (now - REFUSED_KEEP_SEC,))
            self.db.execute("INSERT OR REPLACE INTO outbox_refused (task_id, tenant, item, refused_at) "
                            "VALUES (?,?,?,?)", (item.task_id, item.tenant, item.to_json(), now))
            self._remove(item.task_id, now)

    def _remove(self, task_id: str, now: float) -> None:
        """Within the caller's transaction: out of the order, into the recently left."""
        self.db.execute("DELETE FROM outbox_left WHERE left_at <= ?", (now - LEFT_KEEP_SEC,))
        self.db.execute("INSERT OR REPLACE INTO outbox_left (task_id, left_at) VALUES (?,?)", (task_id, now))
        self.db.execute("DELETE FROM outbox WHERE task_id = ?", (task_id,))

    async def oldest(self, now: float) -> OutboxItem | None:
        rows = self.db.execute("SELECT item FROM outbox ORDER BY seq LIMIT ?", (DUE_WINDOW,)).fetchall()
        return _first_due([OutboxItem.from_json(row[0]) for row in rows], now)

    async def defer(self, item: OutboxItem) -> None:
        self.db.execute("UPDATE outbox SET item = ? WHERE task_id = ?", (item.to_json(), item.task_id))

    async def remove(self, task_id: str) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self._remove(task_id, time.time())

    async def left_lately(self, task_id: str) -> bool:
        row = self.db.execute("SELECT 1 FROM outbox_left WHERE task_id = ? AND left_at > ?",
                              (task_id, time.time() - LEFT_KEEP_SEC)).fetchone()
        return row is not None

    async def size(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM outbox").fetchone()[0])

    async def tenant_size(self, tenant: str) -> int:
        return int(self.db.execute("SELECT count(*) FROM outbox WHERE tenant = ?", (tenant,)).fetchone()[0])

    async def lock(self, owner: str, ttl: float) -> bool:
        return True  # the file belongs to this process

    async def unlock(self, owner: str) -> None:
        return None


# both keys share the outbox's hash tag, so this is one atomic step even on Redis Cluster:
# an item is never stored without its place in the order
_PUT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[3], ARGV[1])
end
return 1
"""


class RedisOutbox:
    def __init__(self, client: AnyRedis, prefix: str) -> None:
        self.redis = client
        tag = "{" + prefix + ":outbox}"
        self.order = f"{tag}:order"
        self.items = f"{tag}:items"
        self.lock_key = f"{tag}:lock"
        self.tag = tag
        self._put = client.register_script(_PUT)
        # the drain lock as each owner in this process holds it: redis-py's Lock, whose token (its own, unique
        # to that hold) is stored in the key; it is renewed and released only by scripts that check the token
        # first, so a hold that lapsed never renews or frees the lock another process has taken since
        self._held: dict[str, Lock] = {}

    def _tenant_key(self, tenant: str) -> str:
        # in the outbox's slot, so that an item, its place in the order and its tenant's count change together
        return f"{self.tag}:tenant:{tenant}"

    async def put(self, item: OutboxItem) -> None:
        await self._put(keys=[self.items, self.order, self._tenant_key(item.tenant)],
                        args=[item.task_id, item.to_json()])

    async def find(self, tenant: str, task_id: str) -> OutboxItem | None:
        raw = await self.redis.hget(self.items, task_id) or await self.redis.get(self._refused_key(task_id))
        item = OutboxItem.from_json(raw) if raw else None
        return item if item is not None and item.tenant == tenant else None

    def _refused_key(self, task_id: str) -> str:
        return f"{self.tag}:refused:{task_id}"

    def _left_key(self, task_id: str) -> str:
        return f"{self.tag}:left:{task_id}"

    async def refuse(self, item: OutboxItem) -> None:
        # written before the item leaves the order: a crash between the two delivers it again, and the
        # backend refuses it again
        await self.redis.set(self._refused_key(item.task_id), item.to_json(), ex=REFUSED_KEEP_SEC)
        await self.remove(item.task_id)

    async def oldest(self, now: float) -> OutboxItem | None:
        task_ids = await self.redis.lrange(self.order, 0, DUE_WINDOW - 1)
        if not task_ids:
            return None
        raws = await self.redis.hmget(self.items, task_ids)
        for task_id, raw in zip(task_ids, raws, strict=True):
            if raw is None:  # its item was removed after the order was read: its place goes too
                await self.redis.lrem(self.order, 1, task_id.decode() if isinstance(task_id, bytes) else task_id)
        return _first_due([OutboxItem.from_json(raw) for raw in raws if raw is not None], now)

    async def defer(self, item: OutboxItem) -> None:
        # only while it is still waiting: a delivery by another gateway may have removed it
        if await self.redis.hexists(self.items, item.task_id):
            await self.redis.hset(self.items, item.task_id, item.to_json())

    async def remove(self, task_id: str) -> None:
        raw = await self.redis.hget(self.items, task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._left_key(task_id), b"1", ex=LEFT_KEEP_SEC)
            pipe.lrem(self.order, 1, task_id)
            pipe.hdel(self.items, task_id)
            if raw is not None:
                pipe.srem(self._tenant_key(OutboxItem.from_json(raw).tenant), task_id)
            await pipe.execute()

    async def left_lately(self, task_id: str) -> bool:
        return bool(await self.redis.exists(self._left_key(task_id)))

    async def size(self) -> int:
        return int(await self.redis.llen(self.order))

    async def tenant_size(self, tenant: str) -> int:
        return int(await self.redis.scard(self._tenant_key(tenant)))

    async def lock(self, owner: str, ttl: float) -> bool:
        held = self._held.get(owner)
        if held is not None:
            try:
                return await held.extend(ttl, replace_ttl=True)
            except LockNotOwnedError:  # its lease lapsed: the lock is free, or another process's now
                del self._held[owner]
        lease = self.redis.lock(self.lock_key, timeout=ttl, thread_local=False)
        if not await lease.acquire(blocking=False):
            return False
        self._held[owner] = lease
        return True

    async def unlock(self, owner: str) -> None:
        held = self._held.get(owner)
        if held is None:
            return
        try:
            await held.release()
        except LockNotOwnedError:  # its lease lapsed: nothing of ours to give up
            pass
        # forgotten only once given up: after a failed release (Redis did not answer) the hold is still ours
        del self._held[owner]


def new_item(task_id: str, tenant: str, upstream: str, method: str, path: str, headers: list[tuple[str, str]],
             body: bytes) -> OutboxItem:
    return OutboxItem(task_id, tenant, upstream, method, path, headers, base64.b64encode(body).decode(), time.time())


def _first_due(items: list[OutboxItem], now: float) -> OutboxItem | None:
    return next((item for item in items if item.not_before <= now), None)
