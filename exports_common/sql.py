"""One way to reach a SQL database: the URL a user writes, the engine, the errors it can end in.

A user writes `postgresql://`, `mysql://` (MariaDB or MySQL), `mariadb://` or `sqlite:///PATH`, or
names a driver (`postgresql+psycopg://`, `mysql+pymysql://`). `sync_url` turns that into the
SQLAlchemy URL of the driver the project installs: psycopg 3 for PostgreSQL, PyMySQL for
MariaDB/MySQL. `async_url` does the same for an asyncio engine: psycopg 3 again, and for
MariaDB/MySQL the asyncio driver the caller names (the project picks one by measurement).

Engines come with bounded waits: a connect timeout, a pool timeout, a connection checked with a ping
before each checkout (one round trip, so that a server restart costs no request an error), and on
MariaDB/MySQL the utf8mb4 character set (the `utf8` of old servers holds no emoji). A value the
user put in the URL's query (`?connect_timeout=20`, `?charset=...`, `?sslmode=require`) wins over
these defaults.

Nothing here ever shows a password: `redacted` is what logs, error messages and admin output print,
and every `SqlError` names its database by that form. The errors say what to do: check that the
server runs, fix the user or password, create the database, upgrade the server.
"""
from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import sqlalchemy
from sqlalchemy import exc
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.engine.interfaces import IsolationLevel
from sqlalchemy.ext.asyncio import AsyncEngine

AsyncMysqlDriver = Literal["aiomysql", "asyncmy"]
T = TypeVar("T")

# the scheme a user writes -> (SQLAlchemy dialect, sync driver)
_DIALECTS = {
    "postgresql": ("postgresql", "psycopg"),
    "postgres": ("postgresql", "psycopg"),  # the scheme PaaS platforms put in their URLs
    "mysql": ("mysql", "pymysql"),
    "mariadb": ("mariadb", "pymysql"),  # SQLAlchemy's MariaDB-only mode: refuses a MySQL server
    "sqlite": ("sqlite", "pysqlite"),
}
_SYNC_DRIVERS = {"postgresql": {"psycopg"}, "mysql": {"pymysql"}, "mariadb": {"pymysql"}, "sqlite": {"pysqlite"}}
# drivers an async URL may name; a sync driver's name there means "the asyncio driver of that database"
_ASYNC_DRIVERS = {"postgresql": {"psycopg", "psycopg_async"}, "mysql": {"aiomysql", "asyncmy"},
                  "mariadb": {"aiomysql", "asyncmy"}, "sqlite": {"aiosqlite"}}
_SECRET_QUERY_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)
PRODUCT_NAMES = {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "mysql": "MySQL", "sqlite": "SQLite"}


class SqlError(Exception):
    """A database could not be used. The message names the database by its redacted URL and says what to do."""

    retryable: bool = False  # whether the same call may succeed later without a change of config

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.url = url  # redacted


class SqlUrlError(SqlError, ValueError):
    """The URL cannot be read or names a driver the project does not install."""


class SqlUnreachable(SqlError):
    """No answer from the server: down, restarting, stalled, wrong host or port, or the network in between."""

    retryable = True


class SqlAuthFailed(SqlError):
    """The server refused the user or password."""


class SqlUnknownDatabase(SqlError):
    """The server runs, but the database the URL names does not exist there."""


class SqlUnsupportedServer(SqlError):
    """A server this code does not support, or an older version of one."""


class SqlBusy(SqlError):
    """Every pooled connection stayed in use for the whole pool timeout."""

    retryable = True


class SqlFailed(SqlError):
    """Any other error the database reported; retryable when the connection broke under the statement."""

    def __init__(self, message: str, url: str = "", retryable: bool = False) -> None:
        super().__init__(message, url)
        self.retryable = retryable


def _parse(url: str | URL) -> URL:
    try:
        return make_url(url)
    except (exc.ArgumentError, ValueError):
        raise SqlUrlError(f"cannot read the database URL {redacted(url)}: write it as "
                          "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, mysql://..., or sqlite:///PATH "
                          "(percent-encode '@', ':' and '/' inside the user or password)", redacted(url)) from None


def _checked(url: str | URL, allowed: dict[str, set[str]], default: Mapping[str, str]) -> URL:
    parsed = _parse(url)
    scheme, _, driver = parsed.drivername.partition("+")
    if scheme not in _DIALECTS:
        raise SqlUrlError(f"the database URL {redacted(url)} names '{scheme}', which is not supported: write "
                          "postgresql://, mysql:// (MariaDB or MySQL), mariadb:// or sqlite:///PATH", redacted(url))
    dialect = _DIALECTS[scheme][0]
    if "@" in (parsed.host or ""):
        raise SqlUrlError(f"the database URL {redacted(url)} has an '@' in its password or host: "
                          "percent-encode it as %40", redacted(url))
    if driver and driver not in allowed[dialect] | _SYNC_DRIVERS[dialect]:
        known = ", ".join(f"{scheme}+{name}://" for name in sorted(allowed[dialect]))
        raise SqlUrlError(f"the database URL {redacted(url)} names the driver '{driver}', which is not one the project "
                          f"uses here: write {scheme}:// (or {known})", redacted(url))
    if not driver or driver not in allowed[dialect]:
        driver = default[dialect]
    return parsed.set(drivername=f"{dialect}+{driver}")


def sync_url(url: str | URL) -> URL:
    """The URL with the driver the project installs: psycopg 3, PyMySQL or the standard sqlite3.

    Raises SqlUrlError for a URL that cannot be read, an unknown scheme or another driver.
    """
    return _checked(url, _SYNC_DRIVERS, {dialect: driver for dialect, driver in _DIALECTS.values()})


def async_url(url: str | URL, *, mysql_driver: AsyncMysqlDriver) -> URL:
    """The URL with an asyncio driver: psycopg 3 for PostgreSQL, `mysql_driver` for MariaDB/MySQL.

    An async driver named in the URL wins; a sync driver's name (`mysql+pymysql://`) is replaced.
    SQLite needs aiosqlite, which the project does not install.
    """
    defaults = {"postgresql": "psycopg", "mysql": mysql_driver, "mariadb": mysql_driver, "sqlite": "aiosqlite"}
    return _checked(url, _ASYNC_DRIVERS, defaults)


def redacted(url: str | URL) -> str:
    """The URL as logs, errors and admin output may show it: password and secret query values as ***."""
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError):
        scheme = str(url).partition("://")[0]
        return f"{scheme}://***" if re.fullmatch(r"[A-Za-z0-9+_.-]{1,40}", scheme) else "***"
    if "@" in (parsed.host or ""):  # a password with a bare '@' leaves part of it in the host
        return f"{parsed.drivername}://***"
    secret = [key for key in parsed.query if _SECRET_QUERY_KEY.search(key)]
    if secret:  # a placeholder that URL quoting leaves alone, then the stars
        parsed = parsed.update_query_dict({key: "__redacted__" for key in secret})
    return parsed.render_as_string(hide_password=True).replace("__redacted__", "***")


@dataclass(frozen=True)
class EngineSettings:
    """How an engine waits and pools. At most `pool_size + max_overflow` connections at once.

    - `pool_timeout`: how long a checkout waits for a free connection before it raises (SqlBusy).
    - `connect_timeout`: how long opening a connection may take (PostgreSQL counts whole seconds, at least 2).
    - `pool_recycle`: a connection older than this is replaced before use, before a server or a proxy
      drops it for idleness (MariaDB's wait_timeout).
    - `pre_ping`: check a pooled connection before handing it out, so that a server restart costs no
      statement an error; one round trip per checkout (about 0.1 ms on loopback).
    - `read_timeout` (PyMySQL only): a bound on every read from the server, so it must exceed the longest
      statement. It is what ends a statement on a stalled MariaDB; psycopg has none (see `within`).
    - `application_name`: shown in pg_stat_activity (PostgreSQL) and session_connect_attrs (PyMySQL).
    """

    pool_size: int = 5
    max_overflow: int = 0
    pool_timeout: float = 10.0
    connect_timeout: float = 5.0
    pool_recycle: float = 1800.0
    pre_ping: bool = True
    read_timeout: float | None = None
    application_name: str | None = None


DEFAULT_SETTINGS = EngineSettings()


def _connect_args(url: URL, settings: EngineSettings) -> dict[str, Any]:
    """Driver arguments for the settings, leaving out what the URL's query already sets."""
    dialect, driver = url.get_dialect().name, url.get_driver_name()
    args: dict[str, Any] = {}
    if dialect == "postgresql":
        args["connect_timeout"] = max(2, math.ceil(settings.connect_timeout))  # libpq's unit and minimum
        if settings.application_name:
            args["application_name"] = settings.application_name
    elif dialect in ("mysql", "mariadb"):
        args["connect_timeout"] = settings.connect_timeout
        args["charset"] = "utf8mb4"
        if driver == "pymysql":
            if settings.read_timeout is not None:
                args["read_timeout"] = args["write_timeout"] = settings.read_timeout
            if settings.application_name:
                args["program_name"] = settings.application_name
    elif dialect == "sqlite":
        args["timeout"] = settings.connect_timeout  # how long a statement waits for another writer's lock
    return {key: value for key, value in args.items() if key not in url.query}


def _engine_options(url: URL, settings: EngineSettings) -> dict[str, Any]:
    options: dict[str, Any] = {"connect_args": _connect_args(url, settings),
                               "pool_pre_ping": settings.pre_ping and url.get_dialect().name != "sqlite"}
    if not (url.get_dialect().name == "sqlite" and url.database in (None, "", ":memory:")):
        # a memory database lives in one connection: SQLAlchemy gives it a pool of its own kind
        options |= {"pool_size": settings.pool_size, "max_overflow": settings.max_overflow,
                    "pool_timeout": settings.pool_timeout, "pool_recycle": settings.pool_recycle}
    return options


def make_engine(url: str | URL, settings: EngineSettings = DEFAULT_SETTINGS) -> Engine:
    """A sync engine for the URL a user wrote (see `sync_url`); SqlUrlError if it cannot be used."""
    parsed = sync_url(url)
    return sqlalchemy.create_engine(parsed, **_engine_options(parsed, settings))


def make_async_engine(url: str | URL, *, mysql_driver: AsyncMysqlDriver,
                      settings: EngineSettings = DEFAULT_SETTINGS,
                      isolation_level: IsolationLevel | None = None) -> AsyncEngine:
    """An asyncio engine for the URL a user wrote (see `async_url`). Bound its statements with `within`.

    `isolation_level` is set once on each new connection (not at every checkout, which costs MariaDB/MySQL
    two statements at checkout and two at return)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = async_url(url, mysql_driver=mysql_driver)
    options = _engine_options(parsed, settings)
    if isolation_level is not None:
        options["isolation_level"] = isolation_level
    return create_async_engine(parsed, **options)


async def within(seconds: float, awaitable: Awaitable[T], *, grace: float = 0.2) -> T:
    """Await a statement for at most about `seconds` (+ `grace`), even on a stalled server; else TimeoutError.

    Cancelled once, psycopg asks the server to cancel the statement and waits up to 5 s for that and
    5 s more for the statement to end: on a stalled server a plain asyncio.timeout(1) returns after
    11 s. Cancelled a second time, it closes the connection at once (the pool then replaces it).
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is None:
            return task.result()  # it ended just as it was cancelled
        raise TimeoutError(f"the database did not answer within {seconds:g} s")
    return task.result()


def _version(engine: Engine | AsyncEngine) -> tuple[str, tuple[int, ...]]:
    dialect = engine.dialect
    name = "mariadb" if getattr(dialect, "is_mariadb", False) else dialect.name
    return name, tuple(part for part in dialect.server_version_info or () if isinstance(part, int))


def server_version(engine: Engine) -> tuple[str, tuple[int, ...]]:
    """('postgresql' | 'mariadb' | 'mysql' | 'sqlite', version), from one connection; SqlError if none opens."""
    try:
        with engine.connect():
            pass
    except exc.SQLAlchemyError as error:
        raise sql_error(error, engine.url) from None
    return _version(engine)


async def async_server_version(engine: AsyncEngine) -> tuple[str, tuple[int, ...]]:
    """`server_version` for an asyncio engine."""
    try:
        async with engine.connect():
            pass
    except exc.SQLAlchemyError as error:
        raise sql_error(error, engine.url) from None
    return _version(engine)


def check_version(version: tuple[str, tuple[int, ...]], minimum: Mapping[str, tuple[int, ...]],
                  url: str | URL) -> None:
    """SqlUnsupportedServer unless the server (from `server_version`) is one of `minimum`'s, at least that old.

    `minimum` maps 'postgresql' / 'mariadb' / 'mysql' / 'sqlite' to the oldest version supported.
    """
    name, found = version
    wanted = " or ".join(f"{PRODUCT_NAMES.get(key, key)} {'.'.join(map(str, low))}"
                         for key, low in minimum.items())
    if name not in minimum or found < minimum[name]:
        running = f"{PRODUCT_NAMES.get(name, name)} {'.'.join(map(str, found))}"
        raise SqlUnsupportedServer(f"the database at {redacted(url)} runs {running}; this needs {wanted} "
                                   "or newer: upgrade the server or point the URL at another", redacted(url))


# psycopg gives a statement's errors a SQLSTATE, but a failure to connect only libpq's (English) text
_PG_AUTH = ("password authentication failed", "no password supplied", "pg_hba.conf", "role \"",
            "authentication failed")
_PG_UNKNOWN_DB = "database \""
_PG_UNREACHABLE = ("connection refused", "could not translate host", "failed to resolve host", "timeout expired",
                   "no route to host", "network is unreachable", "server closed the connection",
                   "the database system is", "connection is closed", "consuming input failed",
                   "connection timed out", "could not receive data", "could not send data", "ssl syscall error",
                   "sending query failed", "connection failed")
# SQLSTATE classes: 08 connection exception, 57P0x the server shutting down or starting; 28 auth; 3D000
_PG_UNREACHABLE_STATES = ("08", "57P01", "57P02", "57P03")
# PyMySQL's client and server error numbers
_MYSQL_AUTH = {1044, 1045, 1130, 1698}  # 1130: no account for the client's host
_MYSQL_UNKNOWN_DB = 1049
_MYSQL_UNREACHABLE = {2002, 2003, 2005, 2006, 2013, 2055, 1053}  # 1053: the server is shutting down
_SQLITE_CANTOPEN = 14
_SQLITE_ERROR = 1  # the generic code of a statement SQLite refuses


def _detail(orig: BaseException, url: URL | None) -> str:
    """The driver's own first line, without the password, short enough for one log line."""
    args = orig.args
    text = str(args[1]) if len(args) >= 2 and isinstance(args[0], int) else str(orig)
    text = " ".join(text.strip().splitlines()[0].split()) if text.strip() else type(orig).__name__
    if url is not None and url.password:
        text = text.replace(str(url.password), "***")
    return text[:300]


def _sqlite_refused(orig: BaseException) -> bool:
    """A statement SQLite itself refuses (no such table or column, a syntax error): sqlite3 raises it as an
    OperationalError, but nothing broke and another attempt would fail the same way."""
    code = getattr(orig, "sqlite_errorcode", None)
    return type(orig).__module__.startswith("sqlite3") and isinstance(code, int) and code & 0xFF == _SQLITE_ERROR


def _kind(orig: BaseException, text: str) -> str:
    """'auth', 'unknown_database', 'unreachable' or '' for an error of psycopg, PyMySQL or sqlite3."""
    module = type(orig).__module__
    if module.startswith("sqlite3"):
        return "unknown_database" if getattr(orig, "sqlite_errorcode", None) == _SQLITE_CANTOPEN else ""
    if module.startswith("psycopg"):
        state = getattr(orig, "sqlstate", None)
        if state:
            return ("auth" if state.startswith("28") else "unknown_database" if state == "3D000"
                    else "unreachable" if state.startswith(_PG_UNREACHABLE_STATES) else "")
        if _PG_UNKNOWN_DB in text and "does not exist" in text:
            return "unknown_database"
        return ("auth" if any(m in text for m in _PG_AUTH)
                else "unreachable" if any(m in text for m in _PG_UNREACHABLE) else "")
    code = orig.args[0] if orig.args and isinstance(orig.args[0], int) else None
    return ("auth" if code in _MYSQL_AUTH else "unknown_database" if code == _MYSQL_UNKNOWN_DB
            else "unreachable" if code in _MYSQL_UNREACHABLE else "")


def sql_error(error: BaseException, url: str | URL) -> SqlError:
    """The SqlError for an exception raised by SQLAlchemy or a driver while using the database at `url`."""
    where = redacted(url)
    try:
        parsed: URL | None = make_url(url)
    except (exc.ArgumentError, ValueError):
        parsed = None
    if isinstance(error, SqlError):
        return error
    if isinstance(error, exc.TimeoutError):  # the pool's, not the server's
        return SqlBusy(f"every connection to the database at {where} stayed busy for the whole pool timeout: "
                       "retry shortly, or raise the pool size if this lasts", where)
    if isinstance(error, TimeoutError):
        return SqlUnreachable(f"the database at {where} did not answer in time ({error}): check that the server "
                              "is running and not overloaded", where)
    orig = error.orig if isinstance(error, exc.DBAPIError) and error.orig is not None else error
    detail = _detail(orig, parsed)
    kind = _kind(orig, detail.lower())
    if kind == "auth":
        user = parsed.username if parsed is not None and parsed.username else "(none)"
        return SqlAuthFailed(f"the database at {where} refused user '{user}' ({detail}): check the user and "
                             "password in the URL (or in the variable it is read from) and the user's grants",
                             where)
    if kind == "unknown_database":
        if parsed is not None and parsed.get_backend_name() == "sqlite":
            return SqlUnknownDatabase(f"cannot open the SQLite file of {where} ({detail}): check that its "
                                      "directory exists and that this process may write there", where)
        database = parsed.database if parsed is not None else None
        return SqlUnknownDatabase(f"the database '{database}' does not exist on the server of {where}: create it "
                                  f"(CREATE DATABASE {database}) or fix the database name in the URL", where)
    if kind == "unreachable":
        return SqlUnreachable(f"cannot reach the database at {where} ({detail}): check that the server is "
                              "running and that the URL's host and port are right", where)
    broken = isinstance(error, exc.DBAPIError) and (error.connection_invalidated or (
        isinstance(error, exc.OperationalError) and not _sqlite_refused(orig)))
    return SqlFailed(f"the database at {where} failed: {detail}", where, retryable=broken)
