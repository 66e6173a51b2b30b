"""The task store on PostgreSQL and MariaDB next to Redis and SQLite, same run.

For each store: claim + ack cost (one claimer, tasks queued over 3 tenants, drained one at a time),
the store operations one task costs over its life (create, claim, RUNNING, COMPLETED with the ack:
SQL statements, Redis commands, SQLite statements), for the SQL servers also the round trips it costs
(every request the client sends, counted by a relay in between: the statements, and what SQLAlchemy and
the driver send besides, such as the pool's ping, BEGIN, COMMIT, session settings), and tasks per second
through 1, 2 and 4 backend processes sharing the store, each with 2 claimers doing claim, RUNNING,
COMPLETED + ack (SQLite: one process owns its file, so 1 only; --flow 0 leaves the flows out). Redis
is a private server; the databases are new ones on the machine's servers (TEST_POSTGRES_URL,
TEST_MARIADB_URL), dropped at the end. Redis runs with AOF (fsync every second), as operators are told
to run it.

Run: python -m benchmarks.bench_sql_store [--tasks 300] [--flow 400] [--stores postgresql mariadb]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from backend_stub import lifecycle
from backend_stub.models import Task
from backend_stub.store.base import TaskStore
from backend_stub.store.redis_store import RedisTaskStore
from backend_stub.store.sql_store import SqlTaskStore
from backend_stub.store.sqlite_store import SqliteTaskStore
from exports_common.contract import Status

KINDS = ["sqlite", "redis", "postgresql", "mariadb"]


def _task(n: int) -> Task:
    now = time.time()
    return Task(task_id=f"exp-20260101-{n:016x}", tenant=f"tenant{n % 3}", export_type="e", filters={},
                format="csv", timeout_sec=60, callback_url=None, fingerprint="f", created_at=now, updated_at=now)


def _store(kind: str, where: str) -> TaskStore:
    if kind == "sqlite":
        return SqliteTaskStore(where)
    if kind == "redis":
        url, prefix = where.split("#")
        return RedisTaskStore(url, prefix)
    return SqlTaskStore(where)


def _counter(kind: str, store: TaskStore, where: str) -> Callable[[], int]:
    """Operations the store sends from now on (as tests/test_store_contract.py counts them)."""
    if kind == "redis":
        client = redis.Redis.from_url(where.split("#", maxsplit=1)[0])

        def commands() -> int:
            return int(client.info("stats")["total_commands_processed"])
        start = commands()
        return lambda: commands() - start - 1
    sent = [0]

    def count(*_: Any) -> None:
        sent[0] += 1
    if isinstance(store, SqliteTaskStore):
        store.db.set_trace_callback(count)
    else:
        assert isinstance(store, SqlTaskStore)
        sa.event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    return lambda: sent[0]


async def _one_task(store: TaskStore, consumer: str) -> bool:
    lease = await store.claim(consumer, 30, 0.0)
    if lease is None:
        return False
    await store.update(lease.task_id, lambda t: dataclasses.replace(t, status=Status.RUNNING, attempt=1))
    await store.update(lease.task_id, lifecycle.finish(Status.COMPLETED), ack=lease)
    return True


class _Relay:
    """A TCP relay to a database server that counts round trips: each time a client speaks after the server."""

    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)
        self.round_trips = 0
        self.server: asyncio.Server | None = None
        self.serving: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return self.url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.serving.add(asyncio.current_task())  # type: ignore[arg-type]
        server_r, server_w = await asyncio.open_connection(self.url.host, self.url.port)
        client_turn = [False]

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool) -> None:
            while data := await reader.read(65536):
                if from_client and not client_turn[0]:
                    self.round_trips += 1
                client_turn[0] = from_client
                writer.write(data)
                await writer.drain()
            writer.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(client_r, server_w, True), pipe(server_r, client_w, False),
                                 return_exceptions=True)
        server_w.close()
        client_w.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.serving:
            task.cancel()
        await asyncio.gather(*self.serving, return_exceptions=True)


async def _costs(kind: str, where: str, tasks: int) -> tuple[float, float, float | None]:
    """(us per claim + ack, operations per task over its life, SQL: round trips per task over its life).

    The round trips are counted on another handle on the store, opened through the relay (the claim + ack
    time is taken without it)."""
    store = _store(kind, where)
    await store.open()
    for n in range(tasks):
        await store.create(_task(n))
    start = time.perf_counter()
    for _ in range(tasks):
        lease = await store.claim("bench", 30, 0.0)
        assert lease is not None
        await store.ack(lease)
    claim_ack = (time.perf_counter() - start) / tasks * 1e6
    relay = _Relay(where) if kind in ("postgresql", "mariadb") else None
    if relay is not None:
        await store.close()
        store = _store(kind, await relay.start())
        await store.open()
    sent = _counter(kind, store, where)
    trips = relay.round_trips if relay is not None else 0
    lives = 20
    for n in range(tasks, tasks + lives):
        await store.create(_task(n))
        assert await _one_task(store, "bench")
    operations = sent() / lives
    round_trips = (relay.round_trips - trips) / lives if relay is not None else None
    await store.close()
    if relay is not None:
        await relay.stop()
    return claim_ack, operations, round_trips


def _backend(kind: str, where: str, ready: Any, go: Any) -> None:
    async def run() -> None:
        store = _store(kind, where)
        await store.open()
        ready.put(1)
        await asyncio.get_running_loop().run_in_executor(None, go.wait)

        async def claimer(name: str) -> None:
            while await _one_task(store, name):
                pass
        await asyncio.gather(claimer("a"), claimer("b"))
        await store.close()
    asyncio.run(run())


def _flow(kind: str, where: str, tasks: int, backends: int) -> float:
    """Tasks per second through `backends` processes (started and connected beforehand) draining `tasks`."""
    async def fill() -> None:
        store = _store(kind, where)
        await store.open()
        for n in range(tasks):
            await store.create(_task(n))
        await store.close()
    asyncio.run(fill())
    context = multiprocessing.get_context("spawn")
    ready, go = context.Queue(), context.Event()
    procs = [context.Process(target=_backend, args=(kind, where, ready, go)) for _ in range(backends)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    start = time.perf_counter()
    go.set()
    for proc in procs:
        proc.join(600)
    took = time.perf_counter() - start
    assert all(proc.exitcode == 0 for proc in procs)
    return tasks / took


@contextlib.contextmanager
def _where(kind: str, tmp: Path, redis_url: str) -> Iterator[str]:
    if kind == "sqlite":
        yield str(tmp / f"sqlite{time.time_ns()}")
    elif kind == "redis":
        yield f"{redis_url}#bench{time.time_ns()}"
    else:
        from tests.databases import SERVERS, scratch_database

        with scratch_database(SERVERS[kind], "bench_sql_store") as database:
            yield database.url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--flow", type=int, default=400)
    parser.add_argument("--stores", nargs="+", choices=KINDS, default=KINDS)
    args = parser.parse_args()
    from tests.procs import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), persistent=True).start()  # AOF, as operators are told to run it
        try:
            print(f"{'store':11} {'claim+ack us':>12} {'ops/task':>9} {'trips/task':>10} " +
                  " ".join(f"{f'{n} backend(s) tasks/s':>22}" for n in (1, 2, 4)))
            for kind in args.stores:
                with _where(kind, Path(tmp), server.url) as where:
                    claim_ack, operations, round_trips = asyncio.run(_costs(kind, where, args.tasks))
                flows = []
                for backends in (1, 2, 4):
                    if args.flow <= 0 or (kind == "sqlite" and backends > 1):
                        flows.append("-")
                        continue
                    with _where(kind, Path(tmp), server.url) as where:
                        flows.append(f"{_flow(kind, where, args.flow, backends):.0f}")
                trips = "-" if round_trips is None else f"{round_trips:.1f}"
                print(f"{kind:11} {claim_ack:12.0f} {operations:9.1f} {trips:>10} " +
                      " ".join(f"{f:>22}" for f in flows),
                      flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
