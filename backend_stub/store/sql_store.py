"""Shared store on PostgreSQL or MariaDB/MySQL: tasks, the queue and the change log, for several backends.

SQLAlchemy Core on an asyncio engine (psycopg 3; asyncmy on MariaDB/MySQL, chosen by measurement:
benchmarks/RESULTS.md). Every method is one transaction at READ COMMITTED, retried from the start on
a deadlock (MariaDB 1213, PostgreSQL 40P01), a serialization failure (40001) or a lock wait timeout.

- Claims follow the fair turns of `backend_stub.store.fair`: a tenant's pass lives in its row of
  `exports_turns`, which a claim locks FOR UPDATE before it counts the tenant's running tasks, so two
  claimers never both see a tenant at cap - 1; the queue row is taken with FOR UPDATE SKIP LOCKED.
  The virtual time a joining tenant starts from is the highest pass any tenant had when served.
- Running tasks are the leased queue rows; a lease that ran out is taken over before any new task,
  and only the lease's holder may renew or ack it (fenced by owner).
- Change ids come from a one-row counter updated in the writing transaction as its last step: its
  row lock, held to commit, makes id order the commit order (a sequence would not).
- Idle claimers and change-log readers wait on an event this process sets when it writes. On
  PostgreSQL other backends' writes wake them too: each writing transaction sends a NOTIFY, which a
  LISTEN connection of each store (session mode) turns into that event. They also poll the database
  with a backoff (MariaDB/MySQL: the only way to see other backends' writes), never in a busy loop.
- Every call is bounded (`call_timeout`), also on a stalled server, and fails as SqlUnreachable: a
  request then answers 503 and a worker keeps its task within its lease.
- Times are this host's clock (epoch seconds): backends sharing a database keep their clocks in sync (NTP).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from backend_stub.models import Task
from backend_stub.store import sql_schema as schema
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
from exports_common import sql
from exports_common.contract import TERMINAL, DeliveryState, Status

T = TypeVar("T")
MYSQL_DRIVER: sql.AsyncMysqlDriver = "asyncmy"
# the oldest servers with SKIP LOCKED and the rest this store uses
MINIMUM_VERSIONS = {"postgresql": (13,), "mariadb": (10, 6), "mysql": (8, 0)}
_CHANGE_ID = re.compile(r"[0-9]{20}")
_RETRIES = 10
_PG_RETRY_STATES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available
_MYSQL_RETRY_CODES = {1205, 1213}  # lock wait timeout, deadlock
_TURN_CANDIDATES = 64  # tenants looked at per claim, lowest pass first
_CONTENDED_ROUNDS = 4  # reads of the turns in one claim while other claimers keep serving its candidates
_POLL_MIN_SEC = 0.02
_POLL_MAX_SEC = 0.25
_POLL_MAX_LISTENING_SEC = 2.0  # PostgreSQL with its LISTEN connection up: the poll is only a safety net
_CHANNEL = "exports_task_store"
# PostgreSQL: wakes other backends' waiters when the transaction commits. Sent in the RETURNING of the
# write it announces (no statement of its own); notifications repeated in one transaction arrive once.
_NOTIFY = sa.func.pg_notify(_CHANNEL, "")
_LISTEN_RETRY_SEC = 1.0


def _change_id(number: int) -> str:
    return f"{number:020d}"


def _retryable(error: exc.DBAPIError) -> bool:
    orig = error.orig
    if getattr(orig, "sqlstate", None) in _PG_RETRY_STATES:
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] in _MYSQL_RETRY_CODES


async def check_server(url: str, settings: sql.EngineSettings | None = None) -> None:
    """SqlError (one sentence saying what to do) unless the server answers and is new enough; then migrates."""
    engine = sql.make_async_engine(url, mysql_driver=MYSQL_DRIVER, settings=settings or sql.DEFAULT_SETTINGS)
    try:
        await _prepare(engine, url)
    finally:
        await engine.dispose()
    _prepared.add(url)


# databases this process checked and migrated already (at start, before serving): `open` skips that
_prepared: set[str] = set()


async def _prepare(engine: AsyncEngine, url: str) -> None:
    sql.check_version(await sql.async_server_version(engine), MINIMUM_VERSIONS, url)
    try:
        async with engine.connect() as conn:
            autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.run_sync(schema.migrate)
    except (exc.SQLAlchemyError, OSError) as error:
        raise sql.sql_error(error, url) from None
    except (schema.SchemaTooNew, TimeoutError) as error:
        raise sql.SqlFailed(str(error), sql.redacted(url)) from None


class SqlTaskStore:
    def __init__(self, url: str, fairness: Fairness | None = None, change_retention_sec: float = 600,
                 settings: sql.EngineSettings | None = None) -> None:
        self.url = url
        self.fairness = fairness or Fairness()
        self.change_retention_sec = change_retention_sec
        self.settings = settings or sql.DEFAULT_SETTINGS
        # a call's bound, even on a stalled server: a wait for a pooled connection, a connect, and the
        # statements themselves (short ones, or a wait for a turn row another claimer holds briefly)
        self.call_timeout = self.settings.pool_timeout + self.settings.connect_timeout + 2.0
        self._engine: AsyncEngine | None = None
        self._wakeup = asyncio.Event()  # set by this process's enqueues and acks
        self._appended = asyncio.Event()  # replaced at every append by this process
        self._listener: asyncio.Task[None] | None = None
        self._listening = False

    async def open(self) -> None:
        # set once on each new connection: per checkout it would cost MariaDB/MySQL four more statements a call
        engine = sql.make_async_engine(self.url, mysql_driver=MYSQL_DRIVER, settings=self.settings,
                                       isolation_level="READ COMMITTED")
        try:
            if self.url not in _prepared:
                await _prepare(engine, self.url)
        except BaseException:
            await engine.dispose()
            raise
        self._engine = engine
        if self.postgres:
            self._listener = asyncio.create_task(self._listen(), name="sql-store-listen")

    async def _listen(self) -> None:
        """Wake this process's waiters on every NOTIFY of another backend's write; reconnect when dropped."""
        import psycopg

        conninfo = sql.sync_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        conninfo, autocommit=True, connect_timeout=max(2, int(self.settings.connect_timeout))) as conn:
                    await conn.execute(f"LISTEN {_CHANNEL}")
                    self._listening = True
                    self._woken()  # writes made while it was not listening are found now
                    async for _ in conn.notifies():
                        self._woken()
            except psycopg.Error:
                pass  # the server restarted or is down: the polls go on meanwhile
            finally:
                self._listening = False
            await asyncio.sleep(_LISTEN_RETRY_SEC)

    def _woken(self) -> None:
        self._wakeup.set()
        self._appended_now()

    def _poll_max(self) -> float:
        return _POLL_MAX_LISTENING_SEC if self._listening else _POLL_MAX_SEC

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("store is not open")
        return self._engine

    @property
    def postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    # -- transactions -------------------------------------------------------------------------------

    async def _tx(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `body` in one transaction, again from the start on a deadlock or serialization failure."""
        async def attempt_once() -> T:
            async with self.engine.begin() as conn:
                return await body(conn)

        for attempt in range(_RETRIES):
            try:
                return await sql.within(self.call_timeout, attempt_once())
            except exc.DBAPIError as error:
                if not _retryable(error) or attempt == _RETRIES - 1:
                    raise sql.sql_error(error, self.url) from None
                await asyncio.sleep(random.uniform(0, 0.005 * (attempt + 1)))
            except (exc.SQLAlchemyError, OSError, TimeoutError) as error:
                raise sql.sql_error(error, self.url) from None
        raise AssertionError("unreachable")

    async def _read(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async def read_once() -> T:
            async with self.engine.connect() as conn:
                return await body(conn)

        try:
            return await sql.within(self.call_timeout, read_once())
        except (exc.SQLAlchemyError, OSError, TimeoutError) as error:
            raise sql.sql_error(error, self.url) from None

    # -- records ------------------------------------------------------------------------------------

    @staticmethod
    async def _load(conn: AsyncConnection, task_id: str, lock: bool = False) -> Task | None:
        query = sa.select(schema.tasks.c.body).where(schema.tasks.c.task_id == task_id)
        body = (await conn.execute(query.with_for_update() if lock else query)).scalar()
        return Task.from_json(body) if body is not None else None

    async def _append(self, conn: AsyncConnection, task: Task) -> int:
        """Take the next change id and append the task's entry under it; returns the id.

        The counter's row stays locked to commit, so ids commit in order. PostgreSQL: one statement, the
        counter's UPDATE in a WITH of the entry's INSERT, which also sends the NOTIFY (see `_NOTIFY`).
        MariaDB/MySQL: LAST_INSERT_ID(expr) hands the new id back with the UPDATE's answer (its insert id).
        """
        log, changes = schema.change_log, schema.changes
        entry = {"task_id": task.task_id, "tenant": task.tenant, "at": time.time(),
                 "task": json.dumps(task.public(), separators=(",", ":"))}
        if self.postgres:
            taken = log.update().values(last_id=log.c.last_id + 1).returning(log.c.last_id).cte("taken")
            values = sa.select(taken.c.last_id, *(sa.literal(value, changes.c[name].type)
                                                  for name, value in entry.items()))
            appended = (changes.insert().from_select(["id", *entry], values).add_cte(taken)
                        .returning(changes.c.id, _NOTIFY))
            return int((await conn.execute(appended)).scalar_one())
        bumped = await conn.execute(log.update().values(last_id=sa.func.last_insert_id(log.c.last_id + 1)))
        number = int(bumped.lastrowid)
        await conn.execute(changes.insert().values(id=number, **entry))
        return number

    async def _write(self, conn: AsyncConnection, task: Task, new: bool) -> Task:
        """Write the record and append its change-log entry; the record returned carries the entry's id.

        The last step of a transaction: after the change id is taken, nothing else waits for a lock.
        """
        number = await self._append(conn, task)
        task = dataclasses.replace(task, change_id=_change_id(number))
        row = {"tenant": task.tenant, "status": task.status, "created_at": task.created_at,
               "expire_at": task.expire_at if task.status in TERMINAL else None,
               "callback_due": callback_due(task), "body": task.to_json()}
        if new:
            await conn.execute(schema.tasks.insert().values(task_id=task.task_id, **row))
        else:
            await conn.execute(schema.tasks.update().where(schema.tasks.c.task_id == task.task_id).values(**row))
        return task

    async def _locked_turn(self, conn: AsyncConnection, tenant: str, skip_locked: bool = False) -> int | None:
        """The tenant's pass, its row locked to commit; None if it has no row (or, with `skip_locked`, another
        transaction holds it)."""
        turns = schema.turns
        query = sa.select(turns.c.turn).where(turns.c.tenant == tenant).with_for_update(skip_locked=skip_locked)
        found = (await conn.execute(query)).scalar()
        return None if found is None else int(found)

    async def _enqueue(self, conn: AsyncConnection, task: Task) -> None:
        """Queue the task; a tenant whose queue was empty joins the turns at no less than the virtual time.

        The transaction's `_write`, which always follows, sends the NOTIFY.
        """
        turns, queue = schema.turns, schema.queue
        turn = await self._locked_turn(conn, task.tenant)
        if turn is None:
            insert = (postgresql.insert(turns).on_conflict_do_nothing() if self.postgres
                      else turns.insert().prefix_with("IGNORE"))
            await conn.execute(insert.values(tenant=task.tenant, turn=0, served_at_turn=0))
            turn = await self._locked_turn(conn, task.tenant)
            assert turn is not None
        # the virtual time if the tenant has no waiting task (it joins now), else NULL: one statement for both
        waiting = sa.exists().where(queue.c.tenant == task.tenant, queue.c.lease_until.is_(None))
        vtime = (await conn.execute(sa.select(sa.func.max(turns.c.served_at_turn)).where(~waiting))).scalar()
        if vtime is not None and vtime > turn:
            await conn.execute(turns.update().where(turns.c.tenant == task.tenant).values(turn=vtime))
        await conn.execute(queue.insert().values(task_id=task.task_id, tenant=task.tenant))
        self._wakeup.set()

    def _appended_now(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    # -- the interface ------------------------------------------------------------------------------

    async def create(self, task: Task) -> tuple[Task, bool]:
        async def body(conn: AsyncConnection) -> tuple[Task, bool]:
            existing = await self._load(conn, task.task_id, lock=True)
            if existing is not None:
                return existing, False
            await self._enqueue(conn, task)
            return await self._write(conn, task, new=True), True

        try:
            created = await self._tx(body)
        except sql.SqlFailed:
            existing = await self.get(task.task_id)  # created at the same moment by another backend
            if existing is None:
                raise
            return existing, False
        self._appended_now()
        return created

    async def get(self, task_id: str) -> Task | None:
        return await self._read(lambda conn: self._load(conn, task_id))

    async def active_count(self, tenant: str) -> int:
        tasks = schema.tasks
        query = sa.select(sa.func.count()).select_from(tasks).where(
            tasks.c.tenant == tenant, tasks.c.status.in_([Status.PENDING, Status.RUNNING]))
        return int(await self._read(lambda conn: _scalar(conn, query)))

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None,
        claim: DeliveryClaim | None = None,
    ) -> tuple[Task | None, bool]:
        claims, tasks = schema.callback_claims, schema.tasks

        async def body(conn: AsyncConnection) -> tuple[Task | None, bool]:
            current = await self._load(conn, task_id, lock=True)
            if current is None:
                return None, False
            if claim is not None:
                held = (await conn.execute(sa.select(claims.c.seq, claims.c.holder).where(
                    claims.c.task_id == task_id))).first()
                if held is None or (held.seq, held.holder) != (claim.seq, claim.holder):
                    return current, False  # taken over: the new holder records the outcome
                await conn.execute(claims.delete().where(claims.c.task_id == task_id))
            new = change(current)
            if new is None:
                if claim is not None:  # released: due again when the record says, not when the claim said
                    await conn.execute(tasks.update().where(tasks.c.task_id == task_id).values(
                        callback_due=callback_due(current)))
                return current, False
            if ack is not None:
                await self._ack(conn, ack)
            if enqueue:
                await self._enqueue(conn, new)
            return await self._write(conn, new, new=False), True

        result = await self._tx(body)
        if result[1]:
            self._appended_now()
        return result

    async def list_tasks(
        self, tenant: str, status: str | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        tasks = schema.tasks
        query = sa.select(tasks.c.body).where(tasks.c.tenant == tenant)
        if status:
            query = query.where(tasks.c.status == status)
        if cursor:
            created_at, task_id = decode_cursor(cursor)
            query = query.where(sa.or_(tasks.c.created_at < created_at,
                                       sa.and_(tasks.c.created_at == created_at, tasks.c.task_id < task_id)))
        query = query.order_by(tasks.c.created_at.desc(), tasks.c.task_id.desc()).limit(limit + 1)
        bodies = await self._read(lambda conn: _scalars(conn, query))
        found = [Task.from_json(body) for body in bodies]
        more = len(found) > limit
        found = found[:limit]
        return found, encode_cursor(found[-1].created_at, found[-1].task_id) if more else None

    async def claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        deadline = time.monotonic() + wait_sec
        poll = _POLL_MIN_SEC
        while True:
            self._wakeup.clear()
            lease = await self._tx(lambda conn: self._try_claim(conn, consumer, lease_sec))
            remaining = deadline - time.monotonic()
            if lease is not None or remaining <= 0:
                return lease
            try:  # woken at once by this process's writes; another backend's are found by the next poll
                await asyncio.wait_for(self._wakeup.wait(), min(poll, remaining))
            except TimeoutError:
                poll = min(poll * 2, self._poll_max())

    async def _try_claim(self, conn: AsyncConnection, consumer: str, lease_sec: float) -> Lease | None:
        queue = schema.queue
        now = time.time()
        leased = queue.update().values(lease_owner=consumer, lease_until=now + lease_sec)
        # a claimer waits for a turn row or a lapsed lease's row only while it holds none, so that claimers
        # never wait in a circle
        holding = False
        for _ in range(_CONTENDED_ROUNDS):
            contended = False  # another claimer served a candidate meanwhile: the turns are read again
            lapsed, candidates = await self._look(conn, now, lapsed_too=not holding)
            if lapsed is not None:
                # unless another claimer took it over or its holder renewed it meanwhile (checked under its lock)
                taken = await conn.execute(leased.where(queue.c.seq == lapsed.seq, queue.c.lease_until <= now))
                if taken.rowcount:
                    return Lease(str(lapsed.seq), lapsed.task_id, lease_sec, consumer)
                continue
            for i, tenant in enumerate(candidate.tenant for candidate in candidates):
                turn = await self._locked_turn(conn, tenant, skip_locked=holding)
                if turn is None:
                    contended = True  # another claimer is serving it right now
                    continue
                holding = True
                if i + 1 < len(candidates) and turn > candidates[i + 1].turn:
                    contended = True  # served by another claimer while this one waited for the lock
                    continue
                cap = self.fairness.cap(tenant)
                if cap is not None and await self._running(conn, tenant) >= cap:
                    continue  # at its cap: skipped, not waited for
                row = await self._lease_first_waiting(conn, tenant, leased)
                if row is None:
                    contended = True  # its last waiting task was taken meanwhile
                    continue
                await conn.execute(schema.turns.update().where(schema.turns.c.tenant == tenant).values(
                    turn=turn + self.fairness.stride(tenant), served_at_turn=turn))
                return Lease(str(row.seq), row.task_id, lease_sec, consumer)
            if not contended:
                break
        return None

    async def _look(self, conn: AsyncConnection, now: float,
                    lapsed_too: bool) -> tuple[sa.Row[Any] | None, list[sa.Row[Any]]]:
        """The oldest lapsed lease (if `lapsed_too`) and the tenants with waiting tasks, lowest pass first,
        read in one statement, locking nothing.

        A lease that ran out is taken over before any new task: it already counts against its tenant's cap,
        and it is the oldest work.
        """
        queue, turns = schema.queue, schema.turns
        has_waiting = sa.exists().where(queue.c.tenant == turns.c.tenant, queue.c.lease_until.is_(None))
        waiting = (sa.select(sa.literal(1).label("kind"), sa.cast(sa.null(), queue.c.seq.type).label("seq"),
                             sa.cast(sa.null(), queue.c.task_id.type).label("task_id"), turns.c.tenant, turns.c.turn)
                   .where(has_waiting).order_by(turns.c.turn, turns.c.tenant).limit(_TURN_CANDIDATES))
        if not lapsed_too:
            return None, list((await conn.execute(waiting)).all())
        lapsed = (sa.select(sa.literal(0).label("kind"), queue.c.seq, queue.c.task_id,
                            sa.cast(sa.null(), turns.c.tenant.type).label("tenant"),
                            sa.cast(sa.null(), turns.c.turn.type).label("turn"))
                  .where(queue.c.lease_until <= now).order_by(queue.c.lease_until).limit(1))
        both = sa.union_all(*(sa.select(part.subquery()) for part in (lapsed, waiting))).subquery()
        rows = (await conn.execute(sa.select(both).order_by(both.c.kind, both.c.turn, both.c.tenant))).all()
        if rows and rows[0].kind == 0:
            return rows[0], []
        return None, list(rows)

    async def _lease_first_waiting(self, conn: AsyncConnection, tenant: str,
                                   leased: sa.Update) -> sa.Row[Any] | None:
        """Lease the tenant's oldest waiting task (its turn row locked by this claim): (seq, task_id), or None."""
        queue = schema.queue
        first = (sa.select(queue.c.seq).where(queue.c.tenant == tenant, queue.c.lease_until.is_(None))
                 .order_by(queue.c.seq).limit(1).with_for_update(skip_locked=True))
        if self.postgres:  # one statement: UPDATE ... RETURNING
            taken = leased.where(queue.c.seq == first.scalar_subquery()).returning(queue.c.seq, queue.c.task_id)
            return (await conn.execute(taken)).first()
        row = (await conn.execute(first.add_columns(queue.c.task_id))).first()
        if row is not None:
            await conn.execute(leased.where(queue.c.seq == row.seq))
        return row

    @staticmethod
    async def _running(conn: AsyncConnection, tenant: str) -> int:
        queue = schema.queue
        return int(await _scalar(conn, sa.select(sa.func.count()).select_from(queue).where(
            queue.c.tenant == tenant, queue.c.lease_until.is_not(None))))

    async def renew(self, lease: Lease, consumer: str) -> None:
        queue = schema.queue
        renewed = queue.update().where(queue.c.seq == int(lease.entry_id), queue.c.lease_owner == consumer).values(
            lease_until=time.time() + lease.lease_sec)
        await self._tx(lambda conn: conn.execute(renewed))

    async def _ack(self, conn: AsyncConnection, lease: Lease) -> None:
        # only the lease's holder: a worker whose lease ran out and was taken over frees nothing
        queue = schema.queue
        acked = queue.delete().where(queue.c.seq == int(lease.entry_id), queue.c.lease_owner == lease.owner)
        await conn.execute(acked.returning(_NOTIFY) if self.postgres else acked)  # NOTIFY only if it freed one
        self._wakeup.set()  # a tenant at its running cap may have a turn again

    async def ack(self, lease: Lease) -> None:
        await self._tx(lambda conn: self._ack(conn, lease))

    async def expired(self, now: float, limit: int) -> list[str]:
        tasks = schema.tasks
        query = sa.select(tasks.c.task_id).where(tasks.c.expire_at < now).limit(limit)
        return list(await self._read(lambda conn: _scalars(conn, query)))

    async def due_callbacks(self, now: float, limit: int) -> list[str]:
        tasks = schema.tasks
        query = (sa.select(tasks.c.task_id).where(tasks.c.callback_due <= now)
                 .order_by(tasks.c.callback_due).limit(limit))
        return list(await self._read(lambda conn: _scalars(conn, query)))

    async def claim_callback(self, task_id: str, holder: str, lease_sec: float) -> DeliveryClaim | None:
        claims, tasks = schema.callback_claims, schema.tasks

        async def body(conn: AsyncConnection) -> DeliveryClaim | None:
            now = time.time()
            row = (await conn.execute(sa.select(tasks.c.body, tasks.c.callback_due)
                                      .where(tasks.c.task_id == task_id).with_for_update())).first()
            task = Task.from_json(row.body) if row is not None else None
            cb = task.callback if task is not None else None
            if row is None or task is None or cb is None or cb.get("state") != DeliveryState.PENDING \
                    or "seq" not in cb:
                return None
            held = (await conn.execute(sa.select(claims.c.seq, claims.c.holder, claims.c.until)
                                       .where(claims.c.task_id == task_id))).first()
            if held is not None and held.until > now:
                mine = (held.seq, held.holder) == (cb["seq"], holder)
                return DeliveryClaim(task_id, cb["seq"], holder, task, taken_over=False) if mine else None
            if row.callback_due is None or row.callback_due > now:
                return None
            await conn.execute(claims.delete().where(claims.c.task_id == task_id))
            await conn.execute(claims.insert().values(task_id=task_id, seq=cb["seq"], holder=holder,
                                                      until=now + lease_sec))
            # not due while claimed; if the holder never records an outcome, due again when the claim ends
            await conn.execute(tasks.update().where(tasks.c.task_id == task_id).values(callback_due=now + lease_sec))
            return DeliveryClaim(task_id, cb["seq"], holder, task, taken_over=held is not None)

        return await self._tx(body)

    # -- the change log -----------------------------------------------------------------------------

    @staticmethod
    async def _log_state(conn: AsyncConnection) -> tuple[int, int]:
        log = schema.change_log
        row = (await conn.execute(sa.select(log.c.last_id, log.c.trimmed_through))).one()
        return int(row.last_id), int(row.trimmed_through)

    async def _read_changes(self, after: str | None, limit: int) -> list[ChangeEntry]:
        changes = schema.changes

        async def body(conn: AsyncConnection) -> list[ChangeEntry]:
            position = 0
            if after is not None:
                if not _CHANGE_ID.fullmatch(after):
                    raise ValueError("not a change id of this store")
                position = int(after)
                last, trimmed = await self._log_state(conn)
                if position < trimmed or position > last:
                    raise ChangeLogGap(after)
            rows = await conn.execute(sa.select(changes.c.id, changes.c.task_id, changes.c.tenant, changes.c.task)
                                      .where(changes.c.id > position).order_by(changes.c.id).limit(limit))
            return [ChangeEntry(_change_id(row.id), row.task_id, row.tenant, json.loads(row.task)) for row in rows]

        page_size(limit)
        return await self._read(body)

    async def changes(self, after: str | None, limit: int, wait_sec: float = 0.0) -> list[ChangeEntry]:
        deadline = time.monotonic() + wait_sec
        poll = _POLL_MIN_SEC
        while True:
            appended = self._appended
            entries = await self._read_changes(after, limit)
            remaining = deadline - time.monotonic()
            if entries or remaining <= 0:
                return entries
            try:  # this process's writes wake it at once; other backends' are found by the next poll
                await asyncio.wait_for(appended.wait(), min(poll, remaining))
            except TimeoutError:
                poll = min(poll * 2, self._poll_max())

    async def latest_change_id(self) -> str | None:
        last, _ = await self._read(self._log_state)
        return _change_id(last) if last else None

    async def trim_changes(self) -> int:
        changes, log = schema.changes, schema.change_log
        cutoff = time.time() - self.change_retention_sec

        async def body(conn: AsyncConnection) -> int:
            # from the oldest entry to the first one young enough to keep: as far as it trims
            kept = await _scalar(conn, sa.select(changes.c.id).where(changes.c.at >= cutoff)
                                 .order_by(changes.c.id).limit(1))
            if kept is None:
                kept = await _scalar(conn, sa.select(log.c.last_id)) + 1
            newest_trimmed = await _scalar(conn, sa.select(sa.func.max(changes.c.id)).where(changes.c.id < kept))
            if newest_trimmed is None:
                return 0
            trimmed = await conn.execute(changes.delete().where(changes.c.id < kept))
            await conn.execute(log.update().values(
                trimmed_through=sa.func.greatest(log.c.trimmed_through, newest_trimmed)))
            return int(trimmed.rowcount)

        return await self._tx(body)

    async def change_log_stats(self) -> tuple[int, float | None]:
        changes = schema.changes

        async def body(conn: AsyncConnection) -> tuple[int, float | None]:
            count = await _scalar(conn, sa.select(sa.func.count()).select_from(changes))
            oldest = await _scalar(conn, sa.select(changes.c.at).order_by(changes.c.id).limit(1))
            return int(count), max(0.0, time.time() - oldest) if oldest is not None else None

        return await self._read(body)

    # -- housekeeping -------------------------------------------------------------------------------

    async def delete(self, task_id: str) -> None:
        async def body(conn: AsyncConnection) -> None:
            await conn.execute(schema.tasks.delete().where(schema.tasks.c.task_id == task_id))
            await conn.execute(schema.queue.delete().where(schema.queue.c.task_id == task_id))
            await conn.execute(schema.callback_claims.delete().where(schema.callback_claims.c.task_id == task_id))

        await self._tx(body)

    async def task_counts(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        tasks = schema.tasks
        query = sa.select(tasks.c.tenant, tasks.c.status, sa.func.count(), sa.func.min(tasks.c.created_at)) \
            .group_by(tasks.c.tenant, tasks.c.status)
        rows = await self._read(lambda conn: _rows(conn, query))
        counts: dict[tuple[str, str], int] = {}
        oldest: dict[str, float] = {}
        for tenant, status, n, created in rows:
            counts[(tenant, status)] = int(n)
            if status == Status.PENDING:
                oldest[tenant] = float(created)
        return counts, oldest

    async def ping(self) -> bool:
        await self._read(lambda conn: _scalar(conn, sa.select(sa.literal(1))))
        return True

    async def put_type_definition(self, digest: str, definition: str) -> None:
        kept = schema.type_definitions

        async def body(conn: AsyncConnection) -> None:
            # a digest always names the same text: whoever stored it first, the row is the same
            now = time.time()
            if await _scalar(conn, sa.select(kept.c.digest).where(kept.c.digest == digest)) is None:
                try:
                    async with conn.begin_nested():
                        await conn.execute(kept.insert().values(digest=digest, definition=definition,
                                                                recorded_at=now))
                        return
                except exc.IntegrityError:
                    pass  # another backend stored it between the look and the insert
            await conn.execute(kept.update().where(kept.c.digest == digest).values(recorded_at=now))

        await self._tx(body)

    async def type_definition(self, digest: str) -> str | None:
        kept = schema.type_definitions
        query = sa.select(kept.c.definition).where(kept.c.digest == digest)
        found = await self._read(lambda conn: _scalar(conn, query))
        return None if found is None else str(found)

    async def drop_unused_type_definitions(self, recorded_before: float) -> int:
        kept, tasks = schema.type_definitions, schema.tasks
        named = sa.select(sa.literal(1)).where(_type_digest(tasks.c.body, self.postgres) == kept.c.digest)
        statement = sa.delete(kept).where(kept.c.recorded_at < recorded_before, ~named.exists())

        async def body(conn: AsyncConnection) -> int:
            return int((await conn.execute(statement)).rowcount)

        return await self._tx(body)


def _type_digest(body: sa.ColumnElement[str], postgres: bool) -> sa.ColumnElement[str]:
    """The `type_digest` of a task record's JSON, by the database's own JSON functions."""
    if postgres:
        return sa.cast(body, postgresql.JSONB)["type_digest"].astext
    return sa.func.json_unquote(sa.func.json_extract(body, "$.type_digest"), type_=sa.String())


async def _scalar(conn: AsyncConnection, query: sa.Executable) -> Any:
    return (await conn.execute(query)).scalar()


async def _scalars(conn: AsyncConnection, query: sa.Executable) -> list[Any]:
    return list((await conn.execute(query)).scalars().all())


async def _rows(conn: AsyncConnection, query: sa.Executable) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in (await conn.execute(query)).all()]
