"""The SQL plumbing both SQL features build on: URLs, engines, errors, and the tests' own databases and servers.

Real servers only: the machine's PostgreSQL and MariaDB for the per-test databases, private ones
(tests/databases.py) for kill -9 and SIGSTOP.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from exports_common import sql
from tests.databases import (
    POSTGRES,
    SERVERS,
    MariaDBInstance,
    PostgresInstance,
    SqlDatabase,
    SqlServer,
    _alive,
    admin_engine,
    scratch_database,
)
from tests.procs import free_port

PASSWORD = "s3cr3t-pw"
MINIMUM = {"postgresql": (13,), "mariadb": (10, 6), "mysql": (8, 0)}


@pytest.mark.parametrize(("written", "sync", "asyncio_"), [
    ("postgresql://u@h:5432/db", "postgresql+psycopg://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgres://u@h/db", "postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgresql+psycopg_async://u@h/db", "refused", "postgresql+psycopg_async://u@h/db"),
    ("mysql://root@h:3306/db", "mysql+pymysql://root@h:3306/db", "mysql+asyncmy://root@h:3306/db"),
    ("mysql+pymysql://root@h/db", "mysql+pymysql://root@h/db", "mysql+asyncmy://root@h/db"),
    ("mysql+aiomysql://root@h/db", "refused", "mysql+aiomysql://root@h/db"),
    ("mariadb://root@h/db", "mariadb+pymysql://root@h/db", "mariadb+asyncmy://root@h/db"),
    ("sqlite:////var/x.db", "sqlite+pysqlite:////var/x.db", "sqlite+aiosqlite:////var/x.db"),
    ("postgresql://u@h/db?sslmode=require", "postgresql+psycopg://u@h/db?sslmode=require",
     "postgresql+psycopg://u@h/db?sslmode=require"),
    ("postgresql+psycopg2://u@h/db", "refused", "refused"),
    ("mysql+mysqldb://u@h/db", "refused", "refused"),
    ("oracle://u@h/db", "refused", "refused"),
    (f"postgresql://u:{PASSWORD}@h/db+x", "postgresql+psycopg://u:***@h/db+x", "postgresql+psycopg://u:***@h/db+x"),
    (f"postgresql://u:{PASSWORD}@x@h/db", "refused", "refused"),  # an '@' left unencoded in the password
    (f"not a url {PASSWORD}", "refused", "refused"),
])
def test_a_written_url_maps_to_the_installed_driver(written: str, sync: str, asyncio_: str) -> None:
    for convert, expected in ((sql.sync_url, sync), (lambda u: sql.async_url(u, mysql_driver="asyncmy"), asyncio_)):
        if expected == "refused":
            with pytest.raises(sql.SqlUrlError) as refused:
                convert(written)
            assert PASSWORD not in str(refused.value) and "x@h" not in str(refused.value)
            assert ": write " in str(refused.value) or "percent-encode it as %40" in str(refused.value)
        else:
            assert convert(written).render_as_string(hide_password=True) == expected


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql://app:{PASSWORD}@db:5432/orders", "postgresql://app:***@db:5432/orders"),
    ("postgresql://app:p%40ss%2Fw@db/orders", "postgresql://app:***@db/orders"),
    (f"mysql+pymysql://app@db/orders?password={PASSWORD}&charset=utf8mb4",
     "mysql+pymysql://app@db/orders?charset=utf8mb4&password=***"),
    (f"postgresql://db/x?sslpassword={PASSWORD}&sslmode=require", "postgresql://db/x?sslmode=require&sslpassword=***"),
    (f"postgresql://app:{PASSWORD}@x@db/orders", "postgresql://***"),
    (f"postgresql://app:{PASSWORD}@h1:5432,h2:5433/orders", "postgresql://***"),
    (f"app:{PASSWORD}@db", "***"),
    ("sqlite:////var/lib/exports/tasks.db", "sqlite:////var/lib/exports/tasks.db"),
])
def test_redacted_never_shows_a_password(url: str, shown: str) -> None:
    assert sql.redacted(url) == shown
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return
    assert sql.redacted(parsed) == shown


def test_server_version_and_the_minimum_check(sql_database: SqlDatabase) -> None:
    engine = sql.make_engine(sql_database.url)
    try:
        name, version = sql.server_version(engine)
    finally:
        engine.dispose()
    assert name == sql_database.kind
    assert version >= MINIMUM[name] and all(isinstance(part, int) for part in version)
    sql.check_version((name, version), MINIMUM, sql_database.url)
    with pytest.raises(sql.SqlUnsupportedServer) as old:
        sql.check_version((name, version), {name: (99,)}, sql_database.url)
    product = sql.PRODUCT_NAMES[name]
    assert f"runs {product} {'.'.join(map(str, version))}" in str(old.value)
    assert f"{product} 99 or newer" in str(old.value)
    with pytest.raises(sql.SqlUnsupportedServer, match="this needs SQLite 3"):
        sql.check_version((name, version), {"sqlite": (3,)}, sql_database.url)


async def test_async_engine_on_postgresql(pg_database: SqlDatabase) -> None:
    engine = sql.make_async_engine(pg_database.url, mysql_driver="asyncmy")
    try:
        assert await sql.async_server_version(engine) == sql.server_version(sql.make_engine(pg_database.url))
        async with engine.connect() as conn:
            assert await sql.within(2, conn.scalar(sa.text("SELECT 41 + 1"))) == 42
    finally:
        await engine.dispose()


def test_engine_defaults_utf8mb4_and_application_name(sql_database: SqlDatabase) -> None:
    engine = sql.make_engine(sql_database.url, sql.EngineSettings(application_name="sql-plumbing-test"))
    try:
        with engine.begin() as conn:
            if sql_database.kind == "mariadb":
                assert conn.scalar(sa.text("SELECT @@character_set_client")) == "utf8mb4"
                assert conn.scalar(sa.text("SELECT @@character_set_connection")) == "utf8mb4"
            else:
                assert conn.scalar(sa.text("SELECT application_name FROM pg_stat_activity "
                                           "WHERE pid = pg_backend_pid()")) == "sql-plumbing-test"
            conn.execute(sa.text("CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(20))"))
            conn.execute(sa.text("INSERT INTO notes VALUES (1, :body)"), {"body": "snow ☃ 🙂"})
            assert conn.scalar(sa.text("SELECT body FROM notes")) == "snow ☃ 🙂"
    finally:
        engine.dispose()
    # a value in the URL's query wins over the default
    with sql.make_engine(sql_database.url + "?connect_timeout=7").connect() as conn:
        if sql_database.kind == "postgresql":
            assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == "7"  # type: ignore[union-attr]
        else:
            assert conn.connection.dbapi_connection.connect_timeout == 7  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_errors_are_typed_say_what_to_do_and_hide_the_password(kind: str) -> None:
    base = sa.engine.make_url(SERVERS[kind].url)
    cases: list[tuple[sa.engine.URL, type[sql.SqlError], str]] = [
        (base.set(database="no_such_database_here"), sql.SqlUnknownDatabase, "CREATE DATABASE"),
        (base.set(username="no_such_user", password=PASSWORD), sql.SqlAuthFailed, "check the user and password"),
        (base.set(port=free_port(), password=PASSWORD), sql.SqlUnreachable, "check that the server is running"),
        (base.set(host="no-such-host.invalid", password=PASSWORD), sql.SqlUnreachable, "host and port"),
    ]
    for url, kind_of_error, advice in cases:
        written = url.render_as_string(hide_password=False)
        engine = sql.make_engine(written, sql.EngineSettings(connect_timeout=2))
        with pytest.raises(kind_of_error) as raised:
            sql.server_version(engine)
        engine.dispose()
        assert advice in str(raised.value), str(raised.value)
        assert PASSWORD not in str(raised.value)
        assert raised.value.url == sql.redacted(sql.sync_url(url))
        assert (":***@" in raised.value.url) == bool(url.password)
        assert raised.value.retryable == (kind_of_error is sql.SqlUnreachable)


def test_an_exhausted_pool_raises_busy_within_its_timeout(pg_database: SqlDatabase) -> None:
    engine = sql.make_engine(pg_database.url, sql.EngineSettings(pool_size=1, pool_timeout=0.3))
    try:
        with engine.connect():
            began = time.monotonic()
            with pytest.raises(sa.exc.TimeoutError) as exhausted:
                engine.connect()
            assert 0.25 <= time.monotonic() - began < 1.5
        busy = sql.sql_error(exhausted.value, pg_database.url)
        assert isinstance(busy, sql.SqlBusy) and busy.retryable and "raise the pool size" in busy.message
    finally:
        engine.dispose()


def test_sqlite_engine_and_error(tmp_path: Path) -> None:
    engine = sql.make_engine(f"sqlite:///{tmp_path / 'tasks.db'}")
    assert sql.server_version(engine)[0] == "sqlite"
    engine.dispose()
    with pytest.raises(sql.SqlUnknownDatabase, match="directory exists"):
        sql.server_version(sql.make_engine(f"sqlite:///{tmp_path / 'missing' / 'tasks.db'}"))


def _databases(server: SqlServer) -> set[str]:
    query = ("SELECT datname FROM pg_database" if server.kind == "postgresql"
             else "SELECT schema_name FROM information_schema.schemata")
    with admin_engine(server).connect() as conn:
        return set(conn.execute(sa.text(query)).scalars())


@pytest.mark.parametrize("kind", sorted(SERVERS))
def test_scratch_database_is_created_empty_and_dropped_with_sessions_open(kind: str) -> None:
    server = SERVERS[kind]
    with scratch_database(server, "Drop Me: please!") as database:
        assert database.name.startswith("pytest_") and database.name.endswith("_drop_me_please")
        assert database.name in _databases(server)
        engine = sql.make_engine(database.url)
        assert sa.inspect(engine).get_table_names() == []
        holder = engine.connect()  # a session left open inside a transaction holding a table lock
        holder.execute(sa.text("CREATE TABLE t (id INT PRIMARY KEY)"))
        holder.execute(sa.text("INSERT INTO t VALUES (1)"))
        holder.commit()
        holder.execute(sa.text("SELECT * FROM t FOR UPDATE"))
    assert database.name not in _databases(server)
    engine.dispose()


def test_an_unreachable_server_fails_the_test_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POSTGRES.variable, f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/test")
    began = time.monotonic()
    for _ in range(2):  # the second time from the cache, at once
        with pytest.raises(pytest.fail.Exception) as failed:
            admin_engine(POSTGRES)
        message = str(failed.value)
        assert message.startswith("TEST_POSTGRES_URL: cannot reach the database at postgresql+psycopg://postgres:***@")
        assert "scripts/ensure_test_services.sh" in message and PASSWORD not in message
    assert time.monotonic() - began < 5


def _count(url: str) -> int:
    engine = sql.make_engine(url, sql.EngineSettings(connect_timeout=2))
    try:
        with engine.connect() as conn:
            return int(conn.scalar(sa.text("SELECT count(*) FROM kept")) or 0)
    finally:
        engine.dispose()


@pytest.mark.parametrize("fixture", ["private_postgres", "private_mariadb"])
def test_private_server_survives_kill9_and_restart(fixture: str, request: pytest.FixtureRequest) -> None:
    server: PostgresInstance | MariaDBInstance = request.getfixturevalue(fixture)
    assert server.port not in (5432, 3306)
    engine = sql.make_engine(server.url, sql.EngineSettings(connect_timeout=2))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE kept (id INT PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO kept VALUES (1), (2), (3)"))
    pids = server.pids()
    server.kill9()
    assert len(pids) >= (3 if fixture == "private_postgres" else 1)  # the postmaster and its children
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(sa.exc.OperationalError) as down, engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    assert isinstance(sql.sql_error(down.value, server.url), sql.SqlUnreachable)
    server.start()
    assert _count(server.url) == 3  # committed rows survive the crash
    with engine.connect() as conn:  # the pool's dead connections are replaced (pre-ping)
        assert conn.scalar(sa.text("SELECT count(*) FROM kept")) == 3
    engine.dispose()
    server.restart()  # a clean stop and start
    assert _count(server.url) == 3


def test_paused_mariadb_times_out_a_statement_and_recovers(private_mariadb: MariaDBInstance) -> None:
    engine = sql.make_engine(private_mariadb.url, sql.EngineSettings(read_timeout=1, connect_timeout=2))
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        private_mariadb.pause()
        began = time.monotonic()
        with pytest.raises(sa.exc.OperationalError) as stalled:
            conn.execute(sa.text("SELECT 1"))
        waited = time.monotonic() - began
    assert 0.9 <= waited < 3, waited
    assert isinstance(sql.sql_error(stalled.value, private_mariadb.url), sql.SqlUnreachable)
    private_mariadb.resume()
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT 2")) == 2
    engine.dispose()


async def test_paused_postgres_times_out_a_statement_and_recovers(private_postgres: PostgresInstance) -> None:
    engine = sql.make_async_engine(private_postgres.url, mysql_driver="asyncmy",
                                    settings=sql.EngineSettings(connect_timeout=2))
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
            private_postgres.pause()
            began = time.monotonic()
            with pytest.raises(TimeoutError) as stalled:
                await sql.within(1, conn.execute(sa.text("SELECT 1")))
            waited = time.monotonic() - began
        assert 0.9 <= waited < 2.5, waited  # psycopg alone would wait 10 s more for its cancel request
        assert isinstance(sql.sql_error(stalled.value, private_postgres.url), sql.SqlUnreachable)
        private_postgres.resume()
        async with engine.connect() as conn:
            assert await sql.within(5, conn.scalar(sa.text("SELECT 2"))) == 2
    finally:
        private_postgres.resume()
        await asyncio.wait_for(engine.dispose(), 10)

