"""Small key-value stores with expiry, for the gateway's shared state.

Memory (bounded, per process), SQLite (a local file: survives a restart) and
Redis (shared by several gateway processes) behave alike, so a plugin is written
once against `KeyValue`. Every Redis command touches one key, so the layout works
on Redis Cluster; a caller that wants one tenant's keys in one slot puts
`{tenant}` in them.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Callable, MutableMapping, Protocol

from cachetools import FIFOCache

from exports_common.redis_client import AnyRedis


class KeyValue(Protocol):
    # a store held in this process reads without I/O: `get` without its await (None when it needs I/O)
    get_now: Callable[[str], bytes | None] | None

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes, ttl: float) -> None: ...

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        """Set only if absent (or expired); True when this call set it."""

    async def replace(self, key: str, expected: bytes, value: bytes, ttl: float) -> bool:
        """Compare-and-set: write `value` only if the key holds exactly `expected`; True when written."""

    async def reserve(self, index: str, member: str, ttl: float, cap: int) -> bool:
        """Count `member` in `index` for `ttl`; False (and nothing counted) when `cap` live members are there."""

    async def delete(self, key: str) -> None: ...

    def size(self) -> int | None: ...


class MemoryKV:
    """Held in this process: at most `max_items` entries, the oldest write out first, each with its own expiry.

    The bound and the eviction are cachetools' `FIFOCache`; an entry is `(expires_at, value)`, dropped when a
    read finds it expired.
    """

    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self._entries: MutableMapping[str, tuple[float, bytes]] = FIFOCache(maxsize=max_items)
        self._indexes: dict[str, dict[str, float]] = {}
        self.get_now: Callable[[str], bytes | None] | None = self._live

    def _live(self, key: str) -> bytes | None:
        try:
            expires_at, value = self._entries[key]
        except KeyError:
            return None
        if expires_at <= time.monotonic():
            del self._entries[key]
            return None
        return value

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self._entries[key] = (time.monotonic() + ttl, value)

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        if self._live(key) is not None:
            return False
        await self.set(key, value, ttl)
        return True

    async def replace(self, key: str, expected: bytes, value: bytes, ttl: float) -> bool:
        if self._live(key) != expected:
            return False
        await self.set(key, value, ttl)
        return True

    async def reserve(self, index: str, member: str, ttl: float, cap: int) -> bool:
        now = time.monotonic()
        members = self._indexes.setdefault(index, {})
        for old in [m for m, until in members.items() if until <= now]:
            del members[old]
        if member not in members and len(members) >= cap:
            return False
        members[member] = now + ttl
        return True

    async def delete(self, key: str) -> None:
        self._entries.pop(key, None)

    def size(self) -> int | None:
        return len(self._entries)


class SqliteKV:
    """Durable across restarts of one gateway process; statements are sub-millisecond."""

    PURGE_EVERY = 1000  # writes between deletions of expired rows
    get_now: Callable[[str], bytes | None] | None = None  # a read is a statement on a file

    def __init__(self, path: Path, table: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.table = table
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, expires REAL, v BLOB)")
        self.db.execute(f"CREATE TABLE IF NOT EXISTS {table}_index (grp TEXT, member TEXT, expires REAL, "
                        "PRIMARY KEY (grp, member))")
        self._writes = 0
        self._purge()

    def _purge(self) -> None:
        self.db.execute(f"DELETE FROM {self.table} WHERE expires <= ?", (time.time(),))
        self.db.execute(f"DELETE FROM {self.table}_index WHERE expires <= ?", (time.time(),))

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

    async def replace(self, key: str, expected: bytes, value: bytes, ttl: float) -> bool:
        now = time.time()
        cur = self.db.execute(f"UPDATE {self.table} SET v = ?, expires = ? WHERE k = ? AND v = ? AND expires > ?",
                              (value, now + ttl, key, expected, now))
        return cur.rowcount == 1

    async def reserve(self, index: str, member: str, ttl: float, cap: int) -> bool:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(f"DELETE FROM {self.table}_index WHERE grp = ? AND expires <= ?", (index, now))
            count, present = self.db.execute(
                f"SELECT count(*), sum(member = ?) FROM {self.table}_index WHERE grp = ?", (member, index)).fetchone()
            if not present and count >= cap:
                return False
            self.db.execute(f"INSERT OR REPLACE INTO {self.table}_index VALUES (?,?,?)", (index, member, now + ttl))
            return True

    async def delete(self, key: str) -> None:
        self.db.execute(f"DELETE FROM {self.table} WHERE k = ?", (key,))

    def size(self) -> int | None:
        return int(self.db.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0])


# One key each, so both run on Redis Cluster. Retried after a lost connection they are harmless:
# a second compare-and-set finds its own value and answers 0, which callers resolve by reading back.
_REPLACE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
_RESERVE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
"""


class RedisKV:
    get_now: Callable[[str], bytes | None] | None = None

    def __init__(self, client: AnyRedis, prefix: str) -> None:
        self.redis = client
        self.prefix = prefix
        self._replace = client.register_script(_REPLACE)
        self._reserve = client.register_script(_RESERVE)

    async def get(self, key: str) -> bytes | None:
        value = await self.redis.get(self.prefix + key)
        return value if value is None or isinstance(value, bytes) else value.encode()

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        await self.redis.set(self.prefix + key, value, px=max(1, int(ttl * 1000)))

    async def add(self, key: str, value: bytes, ttl: float) -> bool:
        return bool(await self.redis.set(self.prefix + key, value, px=max(1, int(ttl * 1000)), nx=True))

    async def replace(self, key: str, expected: bytes, value: bytes, ttl: float) -> bool:
        return bool(await self._replace(keys=[self.prefix + key], args=[expected, value, max(1, int(ttl * 1000))]))

    async def reserve(self, index: str, member: str, ttl: float, cap: int) -> bool:
        return bool(await self._reserve(keys=[self.prefix + index], args=[time.time(), member, ttl, cap]))

    async def delete(self, key: str) -> None:
        await self.redis.delete(self.prefix + key)

    def size(self) -> int | None:
        return None
