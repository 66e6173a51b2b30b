"""Embedded store: one SQLite file (WAL) for tasks, the queue and the change log; survives kill -9.

The queue is one table; which row a worker takes next follows the fair turns of
`backend_stub.store.fair` (the turns themselves live in memory: a restart starts them afresh).
The change log is a table whose AUTOINCREMENT ids are never reused; one writer at a time
makes the id order the commit order. Waiting readers are woken by an event the writes set.

Statements are short and run on the event loop thread: each is well under a
millisecond, and keeping them on one thread makes every method a transaction
without locks. One backend process owns the file, so at start-up every lease and
delivery claim left by a previous process is released at once.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sqlite3
import time
from pathlib import Path

from backend_stub.models import Task
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
from backend_stub.store.fair import Fairness, Turns
from exports_common.contract import TERMINAL, DeliveryState, Status

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    expire_at REAL,
    callback_due REAL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_by_callback_due ON tasks (callback_due) WHERE callback_due IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_by_tenant ON tasks (tenant, created_at DESC, task_id DESC);
CREATE INDEX IF NOT EXISTS tasks_active_by_tenant ON tasks (tenant) WHERE status IN ('PENDING', 'RUNNING');
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expire_at) WHERE expire_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    lease_owner TEXT,
    lease_until REAL,
    tenant TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    at REAL NOT NULL,
    task TEXT NOT NULL
);
-- the newest id trimmed away: an `after` below it has lost entries
CREATE TABLE IF NOT EXISTS change_log (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    trimmed_through INTEGER NOT NULL
);
INSERT OR IGNORE INTO change_log VALUES (1, 0);
CREATE TABLE IF NOT EXISTS type_definitions (
    digest TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    recorded_at REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS callback_claims (
    task_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    holder TEXT NOT NULL,
    until REAL NOT NULL
);
"""
# after the migration below: indexes on the tenant column, which older files lack until then
_QUEUE_INDEXES = """
CREATE INDEX IF NOT EXISTS queue_waiting ON queue (tenant, seq) WHERE lease_until IS NULL;
CREATE INDEX IF NOT EXISTS queue_leased ON queue (lease_until) WHERE lease_until IS NOT NULL;
"""
# the tenants with waiting rows, one index seek each (a plain DISTINCT would read every row)
_READY_TENANTS = """
WITH RECURSIVE ready(tenant) AS (
    SELECT min(tenant) FROM queue WHERE lease_until IS NULL
    UNION ALL
    SELECT (SELECT min(tenant) FROM queue WHERE lease_until IS NULL AND tenant > ready.tenant)
    FROM ready WHERE ready.tenant IS NOT NULL
)
SELECT tenant FROM ready WHERE tenant IS NOT NULL
"""
_CHANGE_ID = re.compile(r"[0-9]{20}")


def _change_id(rowid: int) -> str:
    """Fixed width, so that ids compare as strings in log order."""
    return f"{rowid:020d}"


class SqliteTaskStore:
    def __init__(self, data_dir: str, fairness: Fairness | None = None, change_retention_sec: float = 600) -> None:
        self.path = Path(data_dir) / "tasks.sqlite3"
        self._db: sqlite3.Connection | None = None
        self._wakeup = asyncio.Event()
        # replaced by a fresh one at every append: a reader waits on the one current when it found nothing
        self._appended = asyncio.Event()
        self.turns = Turns(fairness or Fairness())
        self.change_retention_sec = change_retention_sec

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        if "tenant" not in {row[1] for row in db.execute("PRAGMA table_info(queue)")}:
            # a file from before fair scheduling: its queue learns each row's tenant once
            db.execute("ALTER TABLE queue ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
            db.execute("UPDATE queue SET tenant = coalesce((SELECT tenant FROM tasks "
                       "WHERE tasks.task_id = queue.task_id), '')")
        db.executescript(_QUEUE_INDEXES)
        if "recorded_at" not in {row[1] for row in db.execute("PRAGMA table_info(type_definitions)")}:
            # a file from before definitions were collected: each counts as recorded long ago
            db.execute("ALTER TABLE type_definitions ADD COLUMN recorded_at REAL NOT NULL DEFAULT 0")
        db.execute("UPDATE queue SET lease_owner = NULL, lease_until = NULL")
        self._db = db
        with db:
            for (task_id,) in db.execute("SELECT task_id FROM callback_claims").fetchall():
                task = self._load(task_id)
                if task is not None:  # due again at once, where its claim had pushed it back
                    db.execute("UPDATE tasks SET callback_due = ? WHERE task_id = ?", (callback_due(task), task_id))
            db.execute("DELETE FROM callback_claims")

    async def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("store is not open")
        return self._db

    def _write(self, task: Task) -> Task:
        """Write the record and append its change-log entry; the record returned carries the entry's id."""
        entry = self.db.execute("INSERT INTO changes (task_id, tenant, at, task) VALUES (?,?,?,?)",
                                (task.task_id, task.tenant, time.time(),
                                 json.dumps(task.public(), separators=(",", ":"))))
        assert entry.lastrowid is not None
        task = dataclasses.replace(task, change_id=_change_id(entry.lastrowid))
        expire = task.expire_at if task.status in TERMINAL else None
        self.db.execute(
            "INSERT OR REPLACE INTO tasks (task_id, tenant, status, created_at, expire_at, callback_due, body) "
            "VALUES (?,?,?,?,?,?,?)",
            (task.task_id, task.tenant, task.status, task.created_at, expire, callback_due(task), task.to_json()),
        )
        # waiting readers run only after this synchronous transaction has committed (or rolled back,
        # when they find nothing and wait again)
        self._appended.set()
        self._appended = asyncio.Event()
        return task

    def _load(self, task_id: str) -> Task | None:
        row = self.db.execute("SELECT body FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return Task.from_json(row[0]) if row else None

    def _enqueue(self, task: Task) -> None:
        waiting = self.db.execute("SELECT 1 FROM queue WHERE tenant = ? AND lease_until IS NULL LIMIT 1",
                                  (task.tenant,)).fetchone()
        if waiting is None:
            self.turns.join(task.tenant)
        self.db.execute("INSERT INTO queue (task_id, tenant) VALUES (?, ?)", (task.task_id, task.tenant))
        self._wakeup.set()

    async def create(self, task: Task) -> tuple[Task, bool]:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            existing = self._load(task.task_id)
            if existing is not None:
                return existing, False
            task = self._write(task)
            self._enqueue(task)
        return task, True

    async def get(self, task_id: str) -> Task | None:
        return self._load(task_id)

    async def active_count(self, tenant: str) -> int:
        row = self.db.execute("SELECT count(*) FROM tasks WHERE tenant = ? AND status IN ('PENDING', 'RUNNING')",
                              (tenant,)).fetchone()
        return int(row[0])

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None,
        claim: DeliveryClaim | None = None,
    ) -> tuple[Task | None, bool]:
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            current = self._load(task_id)
            if current is None:
                return None, False
            if claim is not None:
                held = self.db.execute("SELECT seq, holder FROM callback_claims WHERE task_id = ?",
                                       (task_id,)).fetchone()
                if held != (claim.seq, claim.holder):
                    return current, False  # taken over: the new holder records the outcome
                self.db.execute("DELETE FROM callback_claims WHERE task_id = ?", (task_id,))
            new = change(current)
            if new is None:
                if claim is not None:  # released: due again when the record says, not when the claim said
                    self.db.execute("UPDATE tasks SET callback_due = ? WHERE task_id = ?",
                                    (callback_due(current), task_id))
                return current, False
            new = self._write(new)
            if ack is not None:
                self._ack(ack)
            if enqueue:
                self._enqueue(new)
        return new, True

    async def list_tasks(
        self, tenant: str, status: str | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        sql = "SELECT body FROM tasks WHERE tenant = ?"
        args: list[object] = [tenant]
        if status:
            sql += " AND status = ?"
            args.append(status)
        if cursor:
            created_at, task_id = decode_cursor(cursor)
            sql += " AND (created_at < ? OR (created_at = ? AND task_id < ?))"
            args += [created_at, created_at, task_id]
        sql += " ORDER BY created_at DESC, task_id DESC LIMIT ?"
        args.append(limit + 1)
        tasks = [Task.from_json(r[0]) for r in self.db.execute(sql, args).fetchall()]
        more = len(tasks) > limit
        tasks = tasks[:limit]
        return tasks, encode_cursor(tasks[-1].created_at, tasks[-1].task_id) if more else None

    async def claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        deadline = time.monotonic() + wait_sec
        while True:
            self._wakeup.clear()
            lease = self._try_claim(consumer, lease_sec)
            remaining = deadline - time.monotonic()
            if lease is not None or remaining <= 0:
                return lease
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                pass

    def _try_claim(self, consumer: str, lease_sec: float) -> Lease | None:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute(
                "SELECT seq, task_id FROM queue WHERE lease_until IS NOT NULL AND lease_until <= ? "
                "ORDER BY lease_until LIMIT 1", (now,)).fetchone() or self._next_in_turn()
            if row is None:
                return None
            self.db.execute(
                "UPDATE queue SET lease_owner = ?, lease_until = ? WHERE seq = ?", (consumer, now + lease_sec, row[0])
            )
        return Lease(str(row[0]), row[1], lease_sec, consumer)

    def _next_in_turn(self) -> tuple[int, str] | None:
        ready = [r[0] for r in self.db.execute(_READY_TENANTS)]
        if not ready:
            return None
        running = dict(self.db.execute(
            "SELECT tenant, count(*) FROM queue WHERE lease_until IS NOT NULL GROUP BY tenant").fetchall())
        tenant = self.turns.pick(ready, running)
        if tenant is None:
            return None
        self.turns.served(tenant)
        row = self.db.execute("SELECT seq, task_id FROM queue WHERE tenant = ? AND lease_until IS NULL "
                              "ORDER BY seq LIMIT 1", (tenant,)).fetchone()
        return (row[0], row[1]) if row else None

    async def renew(self, lease: Lease, consumer: str) -> None:
        until = time.time() + lease.lease_sec
        self.db.execute(
            "UPDATE queue SET lease_until = ? WHERE seq = ? AND lease_owner = ?", (until, int(lease.entry_id), consumer)
        )

    def _ack(self, lease: Lease) -> None:
        # only the lease's holder: a worker whose lease ran out and was taken over frees nothing
        self.db.execute("DELETE FROM queue WHERE seq = ? AND lease_owner = ?", (int(lease.entry_id), lease.owner))
        self._wakeup.set()  # a tenant at its running cap may have a turn again

    async def ack(self, lease: Lease) -> None:
        self._ack(lease)

    async def expired(self, now: float, limit: int) -> list[str]:
        rows = self.db.execute(
            "SELECT task_id FROM tasks WHERE expire_at IS NOT NULL AND expire_at < ? LIMIT ?", (now, limit)
        ).fetchall()
        return [r[0] for r in rows]

    async def due_callbacks(self, now: float, limit: int) -> list[str]:
        rows = self.db.execute(
            "SELECT task_id FROM tasks WHERE callback_due IS NOT NULL AND callback_due <= ? "
            "ORDER BY callback_due LIMIT ?", (now, limit)).fetchall()
        return [r[0] for r in rows]

    async def claim_callback(self, task_id: str, holder: str, lease_sec: float) -> DeliveryClaim | None:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            task = self._load(task_id)
            cb = task.callback if task is not None else None
            if task is None or cb is None or cb.get("state") != DeliveryState.PENDING or "seq" not in cb:
                return None
            held = self.db.execute("SELECT seq, holder, until FROM callback_claims WHERE task_id = ?",
                                   (task_id,)).fetchone()
            if held is not None and held[2] > now:
                mine = (held[0], held[1]) == (cb["seq"], holder)
                return DeliveryClaim(task_id, cb["seq"], holder, task, taken_over=False) if mine else None
            due = self.db.execute("SELECT callback_due FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0]
            if due is None or due > now:
                return None
            self.db.execute("INSERT OR REPLACE INTO callback_claims (task_id, seq, holder, until) VALUES (?,?,?,?)",
                            (task_id, cb["seq"], holder, now + lease_sec))
            # not due while claimed; if the holder never records an outcome, due again when the claim ends
            self.db.execute("UPDATE tasks SET callback_due = ? WHERE task_id = ?", (now + lease_sec, task_id))
        return DeliveryClaim(task_id, cb["seq"], holder, task, taken_over=held is not None)

    def _last_change(self) -> int:
        row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        return int(row[0]) if row else 0

    def _read_changes(self, after: str | None, limit: int) -> list[ChangeEntry]:
        position = 0
        if after is not None:
            if not _CHANGE_ID.fullmatch(after):
                raise ValueError("not a change id of this store")
            position = int(after)
            trimmed = self.db.execute("SELECT trimmed_through FROM change_log").fetchone()[0]
            if position < trimmed or position > self._last_change():
                raise ChangeLogGap(after)
        rows = self.db.execute("SELECT id, task_id, tenant, task FROM changes WHERE id > ? ORDER BY id LIMIT ?",
                               (position, page_size(limit))).fetchall()
        return [ChangeEntry(_change_id(row[0]), row[1], row[2], json.loads(row[3])) for row in rows]

    async def changes(self, after: str | None, limit: int, wait_sec: float = 0.0) -> list[ChangeEntry]:
        deadline = time.monotonic() + wait_sec
        while True:
            appended = self._appended
            entries = self._read_changes(after, limit)
            remaining = deadline - time.monotonic()
            if entries or remaining <= 0:
                return entries
            try:
                await asyncio.wait_for(appended.wait(), remaining)
            except TimeoutError:
                pass

    async def latest_change_id(self) -> str | None:
        last = self._last_change()
        return _change_id(last) if last else None

    async def trim_changes(self) -> int:
        cutoff = time.time() - self.change_retention_sec
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            # walks from the oldest entry to the first one young enough to keep: as far as it trims
            kept = self.db.execute("SELECT id FROM changes WHERE at >= ? ORDER BY id LIMIT 1", (cutoff,)).fetchone()
            bound = kept[0] if kept is not None else self._last_change() + 1
            newest_trimmed = self.db.execute("SELECT max(id) FROM changes WHERE id < ?", (bound,)).fetchone()[0]
            if newest_trimmed is None:
                return 0
            trimmed = self.db.execute("DELETE FROM changes WHERE id < ?", (bound,)).rowcount
            self.db.execute("UPDATE change_log SET trimmed_through = max(trimmed_through, ?)", (newest_trimmed,))
        return trimmed

    async def change_log_stats(self) -> tuple[int, float | None]:
        count = self.db.execute("SELECT count(*) FROM changes").fetchone()[0]
        oldest = self.db.execute("SELECT at FROM changes ORDER BY id LIMIT 1").fetchone()
        return int(count), max(0.0, time.time() - oldest[0]) if oldest else None

    async def delete(self, task_id: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
            self.db.execute("DELETE FROM queue WHERE task_id = ?", (task_id,))
            self.db.execute("DELETE FROM callback_claims WHERE task_id = ?", (task_id,))

    async def task_counts(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        rows = self.db.execute("SELECT tenant, status, count(*), min(created_at) FROM tasks GROUP BY tenant, status")
        counts: dict[tuple[str, str], int] = {}
        oldest: dict[str, float] = {}
        for tenant, status, n, created in rows.fetchall():
            counts[(tenant, status)] = n
            if status == Status.PENDING:
                oldest[tenant] = created
        return counts, oldest

    async def ping(self) -> bool:
        self.db.execute("SELECT 1").fetchone()
        return True

    async def put_type_definition(self, digest: str, definition: str) -> None:
        self.db.execute("INSERT INTO type_definitions (digest, definition, recorded_at) VALUES (?, ?, ?) "
                        "ON CONFLICT (digest) DO UPDATE SET recorded_at = excluded.recorded_at",
                        (digest, definition, time.time()))

    async def type_definition(self, digest: str) -> str | None:
        row = self.db.execute("SELECT definition FROM type_definitions WHERE digest = ?", (digest,)).fetchone()
        return str(row[0]) if row else None

    async def drop_unused_type_definitions(self, recorded_before: float) -> int:
        with self.db:
            return self.db.execute(
                "DELETE FROM type_definitions WHERE recorded_at < ? AND NOT EXISTS (SELECT 1 FROM tasks "
                "WHERE json_extract(tasks.body, '$.type_digest') = type_definitions.digest)",
                (recorded_before,)).rowcount
