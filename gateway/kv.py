"""Small key-value stores with expiry, for the gateway's shared state.

Memory (bounded, per process), SQLite (a local file: survives a restart) and
Redis (shared by several gateway processes) behave alike, so a plugin is written
once against `KeyValue`.
"""
from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis


class KeyValue(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl: float) -> None: ...

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        """Set only if absent (or expired); True when this call set it."""

    async def delete(self, key: str) -> None: ...

    def size(self) -> int | None: ...


class MemoryKV:
    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def _live(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= time.monotonic():
            del self._items[key]
            return None
        return item[1]

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self._items[key] = (time.monotonic() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        if self._live(key) is not None:
            return False
        await self.set(key, value, ttl)
        return True

    async def delete(self, key: str) -> None:
        self._items.pop(key, None)

    def size(self) -> int | None:
        return len(self._items)


class SqliteKV:
    """Durable across restarts of one gateway process; statements are sub-millisecond."""

    PURGE_EVERY = 1000  # writes between deletions of expired rows

    def __init__(self, path: Path, table: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.table = table
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, expires REAL, v BLOB)")
        self._writes = 0
        self._purge()

    def _purge(self) -> None:
        self.db.execute(f"DELETE FROM {self.table} WHERE expires <= ?", (time.time(),))

    async def get(self, key: str) -> bytes | None:
        row = self.db.execute(f"SELECT v FROM {self.table} WHERE k = ? AND expires > ?", (key, time.time())).fetchone()
        return row[0] if row else None

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self.db.execute(f"INSERT OR REPLACE INTO {self.table} VALUES (?,?,?)", (key, time.time() + ttl, value))
        self._writes += 1
        if self._writes % self.PURGE_EVERY == 0:
            self._purge()

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(f"DELETE FROM {self.table} WHERE k = ? AND expires <= ?", (key, now))
            cur = self.db.execute(f"INSERT OR IGNORE INTO {self.table} VALUES (?,?,?)", (key, now + ttl, value))
            return cur.rowcount == 1

    async def delete(self, key: str) -> None:
        self.db.execute(f"DELETE FROM {self.table} WHERE k = ?", (key,))

    def size(self) -> int | None:
        return int(self.db.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0])


class RedisKV:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix

    async def get(self, key: str) -> bytes | None:
        value = await self.redis.get(self.prefix + key)
        return value if value is None or isinstance(value, bytes) else value.encode()

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        await self.redis.set(self.prefix + key, value, px=max(1, int(ttl * 1000)))

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        return bool(await self.redis.set(self.prefix + key, value, px=max(1, int(ttl * 1000)), nx=True))

    async def delete(self, key: str) -> None:
        await self.redis.delete(self.prefix + key)

    def size(self) -> int | None:
        return None
