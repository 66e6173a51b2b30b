"""`source: {kind: sql, url, table | query, key, tenant_column, replica_url}`: rows of a real database.

The statement is built with SQLAlchemy Core: `SELECT <columns> FROM <table>` or
`SELECT * FROM (<query>) AS src`, then `WHERE <filters>` (bound parameters on configured
columns only: a filter value never becomes SQL text), `AND <tenant_column> = <the task's
tenant>` when the type sets one, `ORDER BY <key>`.

Each attempt reads one read-only snapshot (PostgreSQL: REPEATABLE READ READ ONLY; MariaDB and
MySQL: START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY) through a server-side cursor, a batch
at a time, so memory stays flat whatever the row count. The statement's timeout is the task's
remaining time. A watcher thread stops the query on the server as soon as the attempt is
cancelled or its deadline passes (psycopg's cancel request on PostgreSQL, `KILL QUERY` from a
second connection on MariaDB/MySQL): the worker thread blocked in a fetch then gets its error.

At load (`check_at_load`) the database is asked for the columns: a table or column it does not
know refuses the config; a database that cannot be reached loads the type unchecked with a
warning, checked again when an attempt opens it (which then fails as retryable). Messages name
neither the URL nor the query: they may reach task records and logs.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import Field, PrivateAttr, field_validator, model_validator
from sqlalchemy.engine import Connection, Engine

from backend_stub.config_model import Strict
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure, TransientFailure
from backend_stub.filters import FilterSpec
from backend_stub.formats.base import ColumnType
from backend_stub.sources import sql_text
from backend_stub.sources.base import Batch, RowSource, SourceContext
from backend_stub.sources.sql_types import column_types
from exports_common import sql

BATCH_ROWS = 5_000
CHECK_TIMEOUT_SEC = 10.0  # the load's look at a table or query
CANCEL_POLL_SEC = 0.1  # how soon a cancel or the deadline reaches the server
PG_CONNECTION_CHECK_MS = 5_000  # PostgreSQL ends a query whose client died (a killed backend) within this
ENGINE_SETTINGS = sql.EngineSettings(pool_size=4, max_overflow=16, pool_timeout=10.0, connect_timeout=5.0,
                                     application_name="export-backend")
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$"
TABLE_NAME = r"^([A-Za-z_][A-Za-z0-9_$]{0,62}\.)?[A-Za-z_][A-Za-z0-9_$]{0,62}$"
# errors a statement ends with when its timeout passed or it was cancelled on the server
_PG_CANCELED = "57014"
_MYSQL_INTERRUPTED = {1317, 1969, 3024}  # killed query, MariaDB max_statement_time, MySQL max_execution_time

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """One engine (one pool) per database URL in this process, shared by every type and config reload."""
    with _engines_lock:
        if url not in _engines:
            _engines[url] = sql.make_engine(url, ENGINE_SETTINGS)
        return _engines[url]


class SqlSource(Strict):
    """A table or a query of a PostgreSQL, MariaDB/MySQL or SQLite database, rows ordered by `key`."""

    kind: Literal["sql"]
    url: str = Field(description="SQLAlchemy URL: postgresql://, mysql:// (MariaDB/MySQL) or sqlite:///PATH; "
                                 "write the password as ${ENV}")
    table: str | None = Field(None, pattern=TABLE_NAME, description="a table (or schema.table) exported whole")
    query: str | None = Field(None, min_length=1, description=(
        "a SELECT, run as SELECT * FROM (<query>) AS src WHERE <filters> ORDER BY src.<key>; "
        "no bind parameters of its own"))
    key: str = Field(pattern=IDENTIFIER, description="a unique, sortable column: rows come out ordered by it")
    tenant_column: str | None = Field(None, pattern=IDENTIFIER, description=(
        "every query also gets <column> = <the task's tenant>; without it a type exports every tenant's rows"))
    replica_url: str | None = Field(None, description=(
        "read attempts from this replica instead, so a long export holds no snapshot on the primary"))
    _columns: list[str] | None = PrivateAttr(None)
    _types: list[ColumnType] | None = PrivateAttr(None)

    @field_validator("url", "replica_url")
    @classmethod
    def _usable_url(cls, url: str | None) -> str | None:
        if url is not None:
            try:
                sql.sync_url(url)
            except sql.SqlUrlError as error:
                raise ValueError(error.message) from None
        return url

    @field_validator("query")
    @classmethod
    def _no_bind_parameters(cls, query: str | None) -> str | None:
        if query is not None:
            names = list(sa.text(query).compile().params)
            if names:
                raise ValueError(f"the query holds :{names[0]}, which would be a bind parameter: a query takes no "
                                 "parameters of its own (filters add them); write \\:name for a literal colon")
        return query

    @model_validator(mode="after")
    def _table_or_query(self) -> SqlSource:
        if (self.table is None) == (self.query is None):
            raise ValueError("a sql source names exactly one of table: or query:")
        return self

    def known_columns(self) -> Sequence[str] | None:
        return self._columns

    def expected_rows(self) -> int | None:
        return None

    def check_at_load(self, filters: Mapping[str, FilterSpec]) -> list[str]:
        """Ask the database for the columns; ValueError for a table or column it does not know.

        Returns warnings: no `tenant_column` (every tenant's rows), a database that could not be reached."""
        warnings = [] if self.tenant_column else [
            "has a sql source without tenant_column: it exports the rows of every tenant to whoever may submit "
            "it; set tenant_column unless only one tenant may submit this type"]
        try:
            self._describe()
        except sql.SqlError as error:
            if isinstance(error, sql.SqlFailed) and not error.retryable:
                raise ValueError(f"the database refused the source: {_detail(error)}") from None
            return [*warnings, f"was not checked: its database could not be used ({type(error).__name__}); it is "
                    "checked on first use, and its tasks fail as retryable until it can be"]
        self._check_columns(filters)
        return warnings

    def _describe(self) -> None:
        """The columns and their types, from a statement that reads no row (SqlError if it fails)."""
        engine = engine_for(self.url)
        try:
            with engine.connect() as conn:
                _limit_statements(conn, CHECK_TIMEOUT_SEC)
                result = conn.execute(sa.select(sa.text("*")).select_from(self._from_clause(None)).where(sa.false()))
                names = list(result.keys())
                types = column_types(conn.dialect.name, result.cursor)
                result.close()
        except sa.exc.SQLAlchemyError as error:
            if _interrupted(error):  # a query so slow it is not even described in time: not a config error
                raise sql.SqlUnreachable("the database did not describe the query in time", "") from None
            raise sql.sql_error(error, self.url) from None
        self._columns, self._types = names, types

    def _check_columns(self, filters: Mapping[str, FilterSpec]) -> None:
        columns = self._columns or []
        wanted = {"key": self.key, "tenant_column": self.tenant_column,
                  **{f"filter {name!r}": spec.column for name, spec in filters.items()}}
        for what, column in wanted.items():
            if column is not None and column not in columns:
                raise ValueError(f"{what}: the source has no column {column!r} (its columns: {', '.join(columns)})")

    def _from_clause(self, columns: Sequence[str] | None) -> sa.FromClause:
        if self.table is not None:
            schema, _, name = self.table.rpartition(".")
            return sa.table(name, *(sa.column(c) for c in columns or ()), schema=schema or None)
        assert self.query is not None
        text = sa.text(self.query)
        if columns is None:
            return text.columns().subquery("src")
        return text.columns(*(sa.column(c) for c in columns)).subquery("src")

    def statement(self, filters: Mapping[str, FilterSpec], values: Mapping[str, Any], tenant: str) -> sa.Select[Any]:
        """The attempt's SELECT: bound filters on configured columns, the tenant's rows, ordered by the key."""
        assert self._columns is not None
        src = self._from_clause(self._columns)
        conditions = [_condition(src.c[filters[name].column], filters[name], value) for name, value in values.items()]
        if self.tenant_column is not None:
            conditions.append(src.c[self.tenant_column] == sa.bindparam("tenant", tenant, type_=sa.String()))
        return sa.select(*src.c).where(*conditions).order_by(src.c[self.key])

    def open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> SqlRows:
        return self._open(ctx, filters, text_values=False)

    def open_text_values(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> SqlRows:
        """Rows whose dates, timestamps and decimals are the text formats' text already (PostgreSQL: sql_text)."""
        return self._open(ctx, filters, text_values=True)

    def _open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec], text_values: bool) -> SqlRows:
        if self._columns is None:  # unreachable at load: checked now
            try:
                self._describe()
            except sql.SqlError as error:
                raise _failure(error) from None
            try:
                self._check_columns(filters)
            except ValueError as error:
                raise PermanentFailure("SOURCE_ERROR", f"the export type's source does not match its "
                                                       f"database: {error}") from None
        return SqlRows(self, ctx, filters, text_values)


def _condition(column: sa.ColumnElement[Any], spec: FilterSpec, value: Any) -> sa.ColumnElement[bool]:
    if isinstance(value, list):
        return column.in_([_bound_value(spec, v) for v in value])
    bound = _bound_value(spec, value)
    if spec.op == "gte":
        return column >= bound
    if spec.op == "lte":
        return column <= bound
    return column == bound


def _bound_value(spec: FilterSpec, value: Any) -> Any:
    return date.fromisoformat(value) if spec.type == "date" else value


def _detail(error: sql.SqlError) -> str:
    """The database's words without the URL (which every SqlError message names)."""
    detail = error.message.partition(" failed: ")[2]
    return detail or type(error).__name__


def _failure(error: sql.SqlError) -> Exception:
    if error.retryable:
        return TransientFailure(f"the export type's database could not be used ({type(error).__name__}); "
                                "the task is tried again")
    return PermanentFailure("SOURCE_ERROR", f"the export type's database failed: {_detail(error)}")


class SqlRows(RowSource):
    """One attempt: a connection in a read-only snapshot, its statement streaming through a server-side cursor."""

    def __init__(self, config: SqlSource, ctx: SourceContext, filters: Mapping[str, FilterSpec],
                 text_values: bool = False) -> None:
        self._ctx = ctx
        self._text_values = text_values
        self._url = config.replica_url or config.url
        self._statement = config.statement(filters, ctx.filters, ctx.tenant)
        self._from_table = config.table is not None
        self.columns = list(config._columns or [])
        self._types = config._types
        self._conn: Connection | None = None
        self._cursor: Any = None  # the driver's server-side cursor
        self._server_id: int | None = None
        self._done = threading.Event()
        self._stopped = threading.Event()  # the watcher stopped the query on the server
        self._exhausted = False
        self._estimate: int | None = None
        try:
            self._begin()
        except BaseException:
            self.close()
            raise

    def column_types(self) -> list[ColumnType] | None:
        return self._types

    def estimate_rows(self) -> int | None:
        return self._estimate

    def _begin(self) -> None:
        engine = engine_for(self._url)
        remaining_ms = int((self._ctx.deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise DeadlineReached()
        with self._translated():
            self._conn = conn = engine.connect()
            name = conn.dialect.name
            if name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                _limit_statements(conn, remaining_ms / 1000)
                settings = {"TimeZone": "UTC", "DateStyle": "ISO",
                            "idle_in_transaction_session_timeout": str(remaining_ms)}
                if (conn.dialect.server_version_info or (0,)) >= (14,):
                    settings["client_connection_check_interval"] = str(PG_CONNECTION_CHECK_MS)
                for setting, value in settings.items():
                    conn.execute(sa.select(sa.func.set_config(setting, value, True)))
            elif name in ("mysql", "mariadb"):
                conn.exec_driver_sql("SET time_zone = '+00:00'")
                self._server_id = int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one())
                _limit_statements(conn, remaining_ms / 1000)
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            else:  # SQLite: one statement reads one consistent state of the file
                pass
            if name == "postgresql" or self._from_table:  # MariaDB's EXPLAIN runs a derived table's query
                self._estimate = _planner_estimate(conn, self._statement)
            threading.Thread(target=self._watch, name="sql-cancel-watch", daemon=True).start()
            self._cursor = _streaming_cursor(conn, self._statement, self._text_values)
            if self._types is None:
                self._types = column_types(name, self._cursor)

    def batches(self) -> Iterator[Batch]:
        cursor = self._cursor
        fix = _aware_columns(self._types or [], self._conn)
        with self._translated():
            while part := cursor.fetchmany(BATCH_ROWS):
                yield part if fix is None else [fix(row) for row in part]
        self._exhausted = True

    def _watch(self) -> None:
        """Stop the query on the server once the attempt is cancelled or out of time (again each poll, until the
        attempt closes: a statement that started just after a cancel is stopped too)."""
        while not self._done.wait(CANCEL_POLL_SEC):
            if self._ctx.cancelled():
                self._stop_on_server()

    def _stop_on_server(self) -> None:
        if self._conn is None:
            return
        self._stopped.set()
        try:
            if self._server_id is not None:
                with engine_for(self._url).connect() as other:
                    other.execute(sa.text("KILL QUERY :id"), {"id": self._server_id})
            else:
                driver_conn = self._conn.connection.dbapi_connection
                # psycopg's cancel request (cancel_safe since 3.2), sqlite3's interrupt
                cancel: Callable[[], None] | None = (getattr(driver_conn, "cancel_safe", None) or
                                                     getattr(driver_conn, "interrupt", None))
                if cancel is not None:
                    cancel()
        except Exception:  # noqa: BLE001 - best effort: the deadline and the connection's close still end it
            pass

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """Turns the database's errors inside an attempt into what the job understands."""
        try:
            yield
        except Exception as error:
            if not _database_error(error, self._conn):
                raise
            if time.monotonic() >= self._ctx.deadline:
                raise DeadlineReached() from None
            if self._stopped.is_set() or self._ctx.cancelled():
                raise Cancelled() from None
            if _interrupted(error):  # the statement's own timeout, just before the deadline on this clock
                raise DeadlineReached() from None
            raise _failure(sql.sql_error(error, self._url)) from None

    def close(self) -> None:
        ended_early = self._cursor is not None and not self._exhausted
        if ended_early:
            self._stop_on_server()  # else closing a MariaDB stream reads every remaining row
        self._done.set()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if ended_early or self._stopped.is_set():
                conn.invalidate()  # a stream cut short: the connection is closed rather than drained or reused
            else:
                if self._cursor is not None:
                    self._cursor.close()
                conn.rollback()
        except Exception as error:
            if not _database_error(error, conn):
                raise
            conn.invalidate()
        finally:
            conn.close()


def _database_error(error: Exception, conn: Connection | None) -> bool:
    """An error of SQLAlchemy or of the driver under it (rows are fetched from the driver's cursor)."""
    return isinstance(error, sa.exc.SQLAlchemyError) or (
        conn is not None and isinstance(error, conn.dialect.loaded_dbapi.Error))


def _interrupted(error: Exception) -> bool:
    """The server ended the statement: its timeout (the task's deadline) or a cancel."""
    orig = getattr(error, "orig", error)
    if getattr(orig, "sqlstate", None) == _PG_CANCELED:
        return True
    args: tuple[Any, ...] = getattr(orig, "args", ())
    return bool(args) and args[0] in _MYSQL_INTERRUPTED


def _streaming_cursor(conn: Connection, statement: sa.Select[Any], text_values: bool) -> Any:
    """The statement, compiled by SQLAlchemy with its bound parameters, run on a server-side cursor of the
    driver (rows come as the driver's tuples, without a Row object per row in between). `text_values`: on
    PostgreSQL, dates, timestamps and numerics come as their output text (sql_text)."""
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params: Any = compiled.params
    if conn.dialect.positional:
        params = [compiled.params[name] for name in compiled.positiontup or ()]
    driver_conn: Any = conn.connection.dbapi_connection
    name = conn.dialect.name
    if name == "postgresql":
        cursor = driver_conn.cursor(name="export_rows")  # a named cursor: DECLARE, then FETCH a batch at a time
        if text_values:
            sql_text.register(cursor)
    elif name in ("mysql", "mariadb"):
        from pymysql.cursors import SSCursor  # loaded already: the dialect's driver

        cursor = driver_conn.cursor(SSCursor)  # unbuffered: rows read as they arrive
    else:
        cursor = driver_conn.cursor()
    cursor.execute(compiled.string, params)
    return cursor


def _limit_statements(conn: Connection, seconds: float) -> None:
    """A timeout on the connection's statements: this transaction's (PostgreSQL) or this session's (MariaDB/MySQL,
    where each use sets its own)."""
    name = conn.dialect.name
    if name == "postgresql":
        conn.execute(sa.select(sa.func.set_config("statement_timeout", str(max(1, int(seconds * 1000))), True)))
    elif getattr(conn.dialect, "is_mariadb", False):
        conn.execute(sa.text("SET SESSION max_statement_time = :sec"), {"sec": max(0.001, seconds)})
    elif name == "mysql":
        conn.execute(sa.text("SET SESSION max_execution_time = :ms"), {"ms": max(1, int(seconds * 1000))})


def _planner_estimate(conn: Connection, statement: sa.Select[Any]) -> int | None:
    """The planner's row estimate for the statement (progress), or None when it gives none."""
    compiled = statement.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    name = conn.dialect.name
    try:
        if name == "postgresql":
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + compiled.string, compiled.params).scalar_one()
            return int(plan[0]["Plan"]["Plan Rows"])
        if name in ("mysql", "mariadb"):
            row = conn.exec_driver_sql("EXPLAIN " + compiled.string, compiled.params).mappings().first()
            return int(row["rows"]) if row is not None and row.get("rows") is not None else None
    except (sa.exc.SQLAlchemyError, KeyError, IndexError, TypeError, ValueError):
        return None
    return None


def _aware_columns(types: Sequence[ColumnType], conn: Connection | None) -> Callable[[Any], tuple[Any, ...]] | None:
    """MariaDB/MySQL TIMESTAMP columns come back naive in the session's zone (UTC here): make them UTC-aware."""
    if conn is None or conn.dialect.name not in ("mysql", "mariadb"):
        return None
    indexes = [i for i, t in enumerate(types) if t.kind == "timestamptz"]
    if not indexes:
        return None

    def fix(row: Any) -> tuple[Any, ...]:
        values = list(row)
        for i in indexes:
            value = values[i]
            if isinstance(value, datetime) and value.tzinfo is None:
                values[i] = value.replace(tzinfo=UTC)
        return tuple(values)
    return fix
