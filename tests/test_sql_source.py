"""`source: {kind: sql}` on the machine's PostgreSQL and MariaDB: rows, filters, tenants, snapshot, cancel, outputs.

Each export runs through the real export job (the worker's thread body) into a file, and is compared
with a direct query on the same database. Every test runs on both servers (ids mariadb, postgresql).
"""
from __future__ import annotations

import base64
import gzip
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.engine import Engine

from backend_stub.config import BackendConfig, ExportTypeConfig
from backend_stub.datasets import DATASETS
from backend_stub.export_job import ExportJob, JobResult
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure, TransientFailure
from backend_stub.models import Task
from backend_stub.sources.sql import SqlRows, SqlSource
from exports_common import sql
from tests.conftest import backend_config
from tests.databases import PostgresInstance, SqlDatabase
from tests.helpers import backend_create, wait_status
from tests.procs import Service, backend_headers, free_port, wait_until

TENANTS = ("acme", "globex")
STATUSES = ("new", "paid", "shipped")
FILTERS = {
    "customer": {"type": "string", "column": "customer"},
    "min_qty": {"type": "integer", "column": "qty", "op": "gte"},
    "max_price": {"type": "number", "column": "price", "op": "lte"},
    "since": {"type": "date", "column": "day", "op": "gte"},
    "status": {"type": "enum", "column": "status", "values": list(STATUSES), "multiple": True},
    "tenant": {"type": "string", "column": "tenant"},
}
# (filters, the same condition written by hand for the direct query)
FILTER_CASES: list[tuple[dict[str, Any], str]] = [
    ({}, "1=1"),
    ({"customer": "c7"}, "customer = 'c7'"),
    ({"min_qty": 40}, "qty >= 40"),
    ({"max_price": 12.5}, "price <= 12.5"),
    ({"since": "2026-03-01"}, "day >= '2026-03-01'"),
    ({"status": "paid"}, "status = 'paid'"),
    ({"status": ["new", "shipped"]}, "status IN ('new', 'shipped')"),
    ({"min_qty": 10, "since": "2026-02-10", "status": ["paid"]},
     "qty >= 10 AND day >= '2026-02-10' AND status = 'paid'"),
]


def engine_of(database: SqlDatabase) -> Engine:
    return sql.make_engine(database.url, sql.EngineSettings(pool_size=2))


@pytest.fixture(scope="module")
def orders(module_sql_database: SqlDatabase) -> Iterator[SqlDatabase]:
    """A table `orders` of 600 rows over two tenants (the module's tests only read it)."""
    engine = engine_of(module_sql_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, tenant VARCHAR(20) NOT NULL, "
                             "customer VARCHAR(40), qty INTEGER, price DECIMAL(10,2), day DATE, status VARCHAR(10))")
        conn.execute(sa.text("INSERT INTO orders VALUES (:id, :tenant, :customer, :qty, :price, :day, :status)"), [
            {"id": i, "tenant": TENANTS[i % 2], "customer": f"c{i % 13}", "qty": (i * 7) % 50,
             "price": Decimal(i % 40) / 2, "day": date(2026, 1, 1 + i % 28).replace(month=1 + i % 4),
             "status": STATUSES[i % 3]} for i in range(1, 601)])
    engine.dispose()
    yield module_sql_database


def export_type(database: SqlDatabase, **source: Any) -> ExportTypeConfig:
    """An export type on the database, checked against it as a config load does."""
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": database.url, "key": "id", **source},
                                            "filters": FILTERS, "formats": ["csv", "jsonl", "parquet"]})
    assert isinstance(spec.source, SqlSource)
    spec.source.check_at_load(spec.filters)
    return spec


def job(spec: ExportTypeConfig, tmp_path: Path, fmt: str = "jsonl", filters: Mapping[str, Any] | None = None,
        tenant: str = "acme", timeout: float = 60.0) -> ExportJob:
    task = Task(task_id="exp-20260101-aaaaaaaaaaaaaaaa", tenant=tenant, export_type="orders",
                filters=dict(filters or {}), format=fmt, timeout_sec=int(timeout), callback_url=None,
                fingerprint="", created_at=0.0, updated_at=0.0, compression=spec.compression)
    return ExportJob(spec, task, time.monotonic() + timeout, tmp_path / f"out.{fmt}", lambda path: None)


def run(spec: ExportTypeConfig, tmp_path: Path, fmt: str = "jsonl", filters: Mapping[str, Any] | None = None,
        tenant: str = "acme") -> tuple[bytes, JobResult]:
    export = job(spec, tmp_path, fmt, filters, tenant)
    result = export.run()
    return export.part_path.read_bytes(), result


def jsonl_rows(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def direct(database: SqlDatabase, where: str, tenant: str | None = "acme") -> list[dict[str, Any]]:
    """The same rows by a query written by hand, as JSON would show them."""
    scope = f" AND tenant = '{tenant}'" if tenant else ""
    engine = engine_of(database)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT * FROM orders WHERE {where}{scope} ORDER BY id").mappings().all()
    engine.dispose()
    return [{key: (float(v) if isinstance(v, Decimal) else v.isoformat() if isinstance(v, date) else v)
             for key, v in row.items()} for row in rows]


@pytest.mark.parametrize("shape", ["table", "query"])
def test_rows_equal_a_direct_query_in_order_for_every_filter(orders: SqlDatabase, tmp_path: Path, shape: str) -> None:
    source = {"table": "orders"} if shape == "table" else {
        "query": "SELECT id, tenant, customer, qty, price, day, status FROM orders WHERE qty <> 3"}
    spec = export_type(orders, tenant_column="tenant", **source)
    for filters, where in FILTER_CASES:
        data, result = run(spec, tmp_path, filters=filters)
        expected = direct(orders, where + (" AND qty <> 3" if shape == "query" else ""))
        assert jsonl_rows(data) == expected, filters
        assert result.rows == len(expected) and expected, filters


def test_a_tenant_never_gets_another_tenants_rows_whatever_the_filters(orders: SqlDatabase, tmp_path: Path) -> None:
    spec = export_type(orders, table="orders", tenant_column="tenant")
    for filters in ({}, {"tenant": "acme"}, {"customer": "c1"}, {"status": list(STATUSES)}):
        rows = jsonl_rows(run(spec, tmp_path, filters=filters, tenant="globex")[0])
        assert {row["tenant"] for row in rows} <= {"globex"}, filters
    assert jsonl_rows(run(spec, tmp_path, filters={"tenant": "acme"}, tenant="globex")[0]) == []
    assert len(jsonl_rows(run(spec, tmp_path, tenant="globex")[0])) == 300


def test_without_tenant_column_a_type_exports_every_tenants_rows_and_the_load_warns(orders: SqlDatabase) -> None:
    config = BackendConfig.model_validate({"export_types": {"everyone": {
        "source": {"kind": "sql", "url": orders.url, "table": "orders", "key": "id"}}}})
    assert any("export type everyone" in w and "tenant_column" in w and "every tenant" in w
               for w in config.load_warnings())
    scoped = BackendConfig.model_validate({"export_types": {"scoped": {
        "source": {"kind": "sql", "url": orders.url, "table": "orders", "key": "id", "tenant_column": "tenant"}}}})
    assert scoped.load_warnings() == []


@pytest.mark.parametrize("value", ["x' OR '1'='1", "c1'; DROP TABLE orders; --", "c1\\' OR 1=1 #", "%", "c1%"])
def test_filter_values_that_look_like_sql_are_plain_values_and_the_table_is_unchanged(
        orders: SqlDatabase, tmp_path: Path, value: str) -> None:
    spec = export_type(orders, table="orders")
    assert jsonl_rows(run(spec, tmp_path, filters={"customer": value})[0]) == []
    assert len(direct(orders, "1=1", tenant=None)) == 600


def test_a_type_naming_what_the_database_lacks_is_refused_at_load_naming_the_type(orders: SqlDatabase) -> None:
    for source, words in [({"table": "no_such_table"}, "refused the source"),
                          ({"table": "orders", "tenant_column": "owner"}, "tenant_column"),
                          ({"query": "SELECT id FROM orders", "tenant_column": "tenant"}, "tenant_column"),
                          ({"table": "orders", "key": "nope"}, "key")]:
        with pytest.raises(ValueError) as raised:
            BackendConfig.model_validate({"export_types": {"broken": {
                "source": {"kind": "sql", "url": orders.url, "key": "id", **source}}}})
        assert "export_types.broken.source" in str(raised.value) and words in str(raised.value), source
        assert orders.url not in str(raised.value)


def test_a_query_with_bind_parameters_of_its_own_is_refused(orders: SqlDatabase) -> None:
    with pytest.raises(ValueError, match="bind parameter"):
        ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": orders.url, "key": "id",
                                                    "query": "SELECT * FROM orders WHERE tenant = :tenant"}})


def test_max_rows_stops_a_runaway_export(orders: SqlDatabase, tmp_path: Path) -> None:
    spec = export_type(orders, table="orders").model_copy(update={"max_rows": 100})
    with pytest.raises(PermanentFailure, match="more than 100 rows"):
        run(spec, tmp_path)


# ---------------------------------------------------------------------------------------------------
# output rules


def create_values_table(database: SqlDatabase) -> None:
    pg = database.kind == "postgresql"
    ts, tstz, blob = ("TIMESTAMP", "TIMESTAMPTZ", "BYTEA") if pg else ("DATETIME(6)", "TIMESTAMP(6) NULL", "BLOB")
    engine = engine_of(database)
    with engine.begin() as conn:
        if not pg:
            conn.exec_driver_sql("SET time_zone = '+00:00'")
        conn.exec_driver_sql(f"CREATE TABLE tricky (id INTEGER PRIMARY KEY, txt VARCHAR(50), d DATE, ts {ts}, "
                             f"tz {tstz}, amount DECIMAL(38,18), big DECIMAL(10,0), bin {blob})")
        conn.execute(sa.text("INSERT INTO tricky VALUES (:id, :txt, :d, :ts, :tz, :amount, :big, :bin)"), [
            {"id": 1, "txt": "Grüße, \"quoted\"\n日本 😀", "d": date(2026, 2, 28),
             "ts": datetime(2026, 2, 28, 23, 59, 58, 123456), "tz": datetime(2026, 3, 1, 1, 2, 3, 500000, tzinfo=UTC),
             "amount": Decimal("12345678901234567890.123456789012345678"), "big": Decimal("-9999999999"),
             "bin": b"\x00\xff\x10binary"},
            {"id": 2, "txt": "", "d": None, "ts": None, "tz": None, "amount": Decimal("0.000000000000000001"),
             "big": None, "bin": b""},
            {"id": 3, "txt": None, "d": date(1999, 12, 31), "ts": None, "tz": None, "amount": None, "big": 0,
             "bin": None}])
    engine.dispose()


EXPECTED_CSV = (
    "id,txt,d,ts,tz,amount,big,bin\r\n"
    '1,"Grüße, ""quoted""\n日本 😀",2026-02-28,2026-02-28T23:59:58.123456,2026-03-01T01:02:03.500000Z,'
    "12345678901234567890.123456789012345678,-9999999999,AP8QYmluYXJ5\r\n"
    '2,"",,,,0.000000000000000001,,""\r\n'
    "3,,1999-12-31,,,,0,\r\n")
EXPECTED_JSONL = (
    '{"id":1,"txt":"Grüße, \\"quoted\\"\\n日本 😀","d":"2026-02-28","ts":"2026-02-28T23:59:58.123456",'
    '"tz":"2026-03-01T01:02:03.500000Z","amount":12345678901234567890.123456789012345678,"big":-9999999999,'
    '"bin":"AP8QYmluYXJ5"}\n'
    '{"id":2,"txt":"","d":null,"ts":null,"tz":null,"amount":0.000000000000000001,"big":null,"bin":""}\n'
    '{"id":3,"txt":null,"d":"1999-12-31","ts":null,"tz":null,"amount":null,"big":0,"bin":null}\n')


def test_null_empty_dates_timestamps_decimals_unicode_and_binary_in_csv_and_jsonl(
        sql_database: SqlDatabase, tmp_path: Path) -> None:
    create_values_table(sql_database)
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "table": "tricky",
                                                       "key": "id"}, "formats": ["csv", "jsonl", "parquet"]})
    assert run(spec, tmp_path, "csv")[0].decode() == EXPECTED_CSV
    assert run(spec, tmp_path, "jsonl")[0].decode() == EXPECTED_JSONL


def test_parquet_keeps_the_databases_types_read_back_through_pyarrow(sql_database: SqlDatabase,
                                                                       tmp_path: Path) -> None:
    create_values_table(sql_database)
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "table": "tricky",
                                                       "key": "id"}, "formats": ["parquet"]})
    table = pq.read_table(io.BytesIO(run(spec, tmp_path, "parquet")[0]))
    schema = table.schema
    assert schema.field("tz").type == pa.timestamp("us", tz="UTC")
    assert schema.field("ts").type == pa.timestamp("us")
    assert schema.field("d").type == pa.date32()
    assert schema.field("bin").type == pa.binary()
    # MariaDB's description does not say whether a DECIMAL is UNSIGNED: a signed one gets a digit more
    extra = 1 if sql_database.kind == "mariadb" else 0
    assert schema.field("amount").type == (pa.decimal256(39, 18) if extra else pa.decimal128(38, 18))
    assert schema.field("big").type == pa.decimal128(10 + extra, 0)
    rows = table.to_pylist()
    assert rows[0] == {"id": 1, "txt": "Grüße, \"quoted\"\n日本 😀", "d": date(2026, 2, 28),
                       "ts": datetime(2026, 2, 28, 23, 59, 58, 123456),
                       "tz": datetime(2026, 3, 1, 1, 2, 3, 500000, tzinfo=UTC),
                       "amount": Decimal("12345678901234567890.123456789012345678"),
                       "big": Decimal("-9999999999"), "bin": b"\x00\xff\x10binary"}
    assert (rows[1]["txt"], rows[1]["d"], rows[1]["bin"], rows[2]["txt"]) == ("", None, b"", None)
    assert rows[1]["amount"] == Decimal("0.000000000000000001")
    assert base64.b64encode(rows[0]["bin"]) == b"AP8QYmluYXJ5"


def test_parquet_decimals_hold_every_value_of_the_declared_type_on_mariadb(
        mariadb_database: SqlDatabase, tmp_path: Path) -> None:
    """PyMySQL's public description has no UNSIGNED flag: a signed DECIMAL(p,s) may become (p+1,s), never less."""
    engine = engine_of(mariadb_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE decs (id INTEGER PRIMARY KEY, a DECIMAL(10,2), b DECIMAL(10,0), "
                             "u DECIMAL(10,2) UNSIGNED, f DECIMAL(2,2), w DECIMAL(65,30), z DECIMAL(5,0) UNSIGNED)")
        conn.exec_driver_sql("INSERT INTO decs VALUES (1, -99999999.99, -9999999999, 99999999.99, -0.99, "
                             "-99999999999999999999999999999999999.999999999999999999999999999999, 99999)")
    engine.dispose()
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": mariadb_database.url, "key": "id",
                                                       "query": "SELECT decs.*, a + b AS s FROM decs"},
                                            "formats": ["parquet"]})
    table = pq.read_table(io.BytesIO(run(spec, tmp_path, "parquet")[0]))
    declared = {"a": (10, 2), "b": (10, 0), "u": (10, 2), "f": (2, 2), "w": (65, 30), "z": (5, 0), "s": (13, 2)}
    for name, (precision, scale) in declared.items():
        written = table.schema.field(name).type
        assert pa.types.is_decimal(written), name
        assert written.scale == scale, name
        assert precision <= written.precision <= precision + 1, (name, written)
    assert (table.schema.field("u").type, table.schema.field("z").type) == (pa.decimal128(10, 2), pa.decimal128(5, 0))
    row = table.to_pylist()[0]
    assert (row["a"], row["u"], row["f"], row["s"]) == (
        Decimal("-99999999.99"), Decimal("99999999.99"), Decimal("-0.99"), Decimal("-10099999998.99"))
    assert row["w"] == Decimal("-99999999999999999999999999999999999.999999999999999999999999999999")


def test_an_unbounded_numeric_is_written_to_parquet_as_its_exact_digits(pg_database: SqlDatabase,
                                                                          tmp_path: Path) -> None:
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE n (id INTEGER PRIMARY KEY, v NUMERIC, j JSONB)")
        conn.exec_driver_sql("INSERT INTO n VALUES (1, 1234567890123456789012345678901234567890.0000000001, "
                             "'{\"a\": [1, 2]}'), (2, NULL, NULL)")
    engine.dispose()
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": pg_database.url, "table": "n",
                                                       "key": "id"}, "formats": ["parquet"]})
    table = pq.read_table(io.BytesIO(run(spec, tmp_path, "parquet")[0]))
    assert table.schema.field("v").type == pa.string() and table.schema.field("j").type == pa.string()
    assert table.column("v").to_pylist() == ["1234567890123456789012345678901234567890.0000000001", None]
    assert json.loads(table.column("j").to_pylist()[0]) == {"a": [1, 2]}


# ---------------------------------------------------------------------------------------------------
# snapshot, cancel, a database down at load


class Ctx:
    """A SourceContext for driving a source by hand."""

    def __init__(self, tenant: str = "acme", filters: Mapping[str, Any] | None = None) -> None:
        self.filters = dict(filters or {})
        self.tenant, self.task_id, self.attempt = tenant, "exp-20260101-aaaaaaaaaaaaaaaa", 1
        self.deadline = time.monotonic() + 60
        self.stop = threading.Event()

    def cancelled(self) -> bool:
        return self.stop.is_set()

    def set_step(self, step: str) -> None:
        pass

    def set_progress(self, percent: int) -> None:
        pass


def test_an_attempt_reads_the_table_as_it_was_when_it_started(sql_database: SqlDatabase) -> None:
    engine = engine_of(sql_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE snap (id INTEGER PRIMARY KEY, v VARCHAR(20))")
        conn.execute(sa.text("INSERT INTO snap VALUES (:id, :v)"), [{"id": i, "v": f"v{i}"} for i in range(20_000)])
    before = [(i, f"v{i}") for i in range(20_000)]
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "table": "snap",
                                                       "key": "id"}})
    assert isinstance(spec.source, SqlSource)
    spec.source.check_at_load({})
    with spec.source.open(Ctx(), {}) as source:
        assert isinstance(source, SqlRows)
        batches = source.batches()
        read = list(next(batches))
        assert 0 < len(read) < 20_000
        with engine.begin() as conn:  # another connection changes rows not yet read, and rows already read
            conn.exec_driver_sql("INSERT INTO snap VALUES (20000, 'new'), (-1, 'new')")
            conn.exec_driver_sql("UPDATE snap SET v = 'changed' WHERE id IN (1, 19000)")
            conn.exec_driver_sql("DELETE FROM snap WHERE id IN (2, 15000, 19999)")
        for batch in batches:
            read.extend(batch)
    assert read == before
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM snap").scalar_one() == 20_000 - 3 + 2
    engine.dispose()


def server_queries(database: SqlDatabase) -> list[Any]:
    """The export's statements still running on the server."""
    engine = engine_of(database)
    with engine.connect() as conn:
        if database.kind == "postgresql":
            found = conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :db AND state = 'active' "
                                         "AND application_name = 'export-backend'"), {"db": database.name}).all()
        else:
            found = conn.execute(sa.text("SELECT id FROM information_schema.processlist WHERE db = :db AND "
                                         "command = 'Query' AND info LIKE '%SLEEP%' AND id <> CONNECTION_ID()"),
                                 {"db": database.name}).all()
    engine.dispose()
    return list(found)


def test_cancel_mid_query_frees_the_server_query_within_2_s(sql_database: SqlDatabase, tmp_path: Path) -> None:
    query = ("SELECT 1 AS id, pg_sleep(30) AS slept" if sql_database.kind == "postgresql"
             else "SELECT seq AS id, SLEEP(30) AS slept FROM seq_1_to_1")  # MariaDB's sequence engine
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "key": "id",
                                                       "query": query}})
    assert isinstance(spec.source, SqlSource)
    spec.source.check_at_load({})
    export = job(spec, tmp_path, "csv")
    outcome: list[BaseException | JobResult] = []

    def body() -> None:
        try:
            outcome.append(export.run())
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    wait_until(lambda: server_queries(sql_database), 10, what="the export's query on the server")
    cancelled_at = time.monotonic()
    export.cancel()
    wait_until(lambda: not server_queries(sql_database), 2, what="the query to end on the server")
    thread.join(5)
    assert time.monotonic() - cancelled_at < 2.5
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled)
    assert not export.part_path.exists()


def test_a_query_still_running_at_the_tasks_deadline_is_stopped_on_the_server(sql_database: SqlDatabase,
                                                                             tmp_path: Path) -> None:
    query = ("SELECT 1 AS id, pg_sleep(30) AS slept" if sql_database.kind == "postgresql"
             else "SELECT seq AS id, SLEEP(30) AS slept FROM seq_1_to_1")
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "key": "id",
                                                       "query": query}})
    assert isinstance(spec.source, SqlSource)
    spec.source.check_at_load({})
    started = time.monotonic()
    with pytest.raises(DeadlineReached):
        job(spec, tmp_path, "csv", timeout=1.5).run()
    assert time.monotonic() - started < 3.5
    wait_until(lambda: not server_queries(sql_database), 2, what="the query to end on the server")


def test_a_type_whose_database_is_down_at_load_loads_with_a_warning_and_its_tasks_retry_until_it_is_up(
        private_postgres: PostgresInstance, tmp_path: Path) -> None:
    engine = sql.make_engine(private_postgres.url, sql.EngineSettings(pool_size=1))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, tenant TEXT)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1, 'acme'), (2, 'globex')")
    engine.dispose()
    private_postgres.stop()
    config = BackendConfig.model_validate({"export_types": {"late": {"source": {
        "kind": "sql", "url": private_postgres.url, "table": "t", "key": "id", "tenant_column": "tenant"}}}})
    assert [w for w in config.load_warnings() if "export type late was not checked" in w]
    assert not any(str(private_postgres.port) in w for w in config.load_warnings())
    spec = config.export_types["late"]
    with pytest.raises(TransientFailure) as raised:
        job(spec, tmp_path, "csv").run()
    assert str(private_postgres.port) not in str(raised.value)
    private_postgres.start()
    assert run(spec, tmp_path, "csv")[0] == b"id,tenant\r\n1,acme\r\n"


def test_a_database_nobody_listens_on_fails_the_attempt_as_retryable() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": url, "table": "t", "key": "id"}})
    assert isinstance(spec.source, SqlSource)
    assert any("not checked" in w for w in spec.source.check_at_load({}))
    with pytest.raises(TransientFailure):
        spec.source.open(Ctx(), {})


def test_a_filter_value_that_looks_like_sql_matches_the_row_holding_that_text(sql_database: SqlDatabase,
                                                                               tmp_path: Path) -> None:
    hostile = ["x' OR '1'='1", "a'); DELETE FROM notes; --", "\\'; DROP TABLE notes; #", "50%", ":tenant"]
    engine = engine_of(sql_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, customer VARCHAR(60))")
        conn.execute(sa.text("INSERT INTO notes VALUES (:id, :customer)"),
                     [{"id": i, "customer": value} for i, value in enumerate([*hostile, "plain", "x"])])
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sql_database.url, "table": "notes",
                                                       "key": "id"},
                                            "filters": {"customer": {"type": "string", "column": "customer"}}})
    for i, value in enumerate(hostile):
        assert jsonl_rows(run(spec, tmp_path, filters={"customer": value})[0]) == [{"id": i, "customer": value}]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM notes").scalar_one() == len(hostile) + 2
    engine.dispose()


def test_the_docs_example_loads_on_a_real_table_in_under_15_lines(pg_database: SqlDatabase) -> None:
    page = (Path(__file__).parent.parent / "docs/backend-teams/export-types.md").read_text()
    section = page.split("## Add an export type on a real table", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert len(example.splitlines()) < 15
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE invoices (id INTEGER PRIMARY KEY, customer_id TEXT, issued_on DATE, "
                             "status TEXT, total NUMERIC(12,2))")
    engine.dispose()
    url_line = next(line for line in example.splitlines() if "url:" in line)
    config = BackendConfig.model_validate(yaml.safe_load(example.replace(
        url_line.split("url: ", 1)[1], pg_database.url)))
    assert config.load_warnings() == []
    assert config.export_types["invoice_export"].formats == ["csv", "jsonl", "parquet"]


def test_parquet_of_a_source_that_declares_no_types_gzip_compressed(tmp_path: Path) -> None:
    spec = ExportTypeConfig.model_validate({"source": {"kind": "synthetic", "dataset": "tickets", "rows": 70_000,
                                                       "seed": 5}, "formats": ["parquet"], "compression": "gzip"})
    data, result = run(spec, tmp_path, "parquet")
    parquet = pq.ParquetFile(io.BytesIO(gzip.decompress(data)))
    assert parquet.metadata.num_rows == result.rows == 70_000 and parquet.metadata.num_row_groups == 2
    expected = list(DATASETS["tickets"].generate(5, 70_000))
    assert [tuple(row.values()) for row in parquet.read().to_pylist()] == expected


KILLED_EXPORT = """
import sys, threading, time
from backend_stub.config import ExportTypeConfig
from tests.test_sql_source import Ctx
spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": sys.argv[1], "key": "id",
                                                   "query": "SELECT 1 AS id, pg_sleep(120) AS slept"}})
with spec.source.open(Ctx(), {}) as source:
    print("started", flush=True)
    for batch in source.batches():
        pass
"""


def test_a_query_whose_backend_was_killed_ends_on_the_server(pg_database: SqlDatabase) -> None:
    """kill -9 of the process mid-query: PostgreSQL notices the dead client and ends the query (<= 30 s)."""
    child = subprocess.Popen([sys.executable, "-c", KILLED_EXPORT, pg_database.url], stdout=subprocess.PIPE,
                             cwd=Path(__file__).parent.parent)
    try:
        wait_until(lambda: server_queries(pg_database), 20, what="the export's query on the server")
        child.kill()
        child.wait(5)
        killed_at = time.monotonic()
        wait_until(lambda: not server_queries(pg_database), 30, interval=0.2, what="the orphaned query to end")
        assert time.monotonic() - killed_at < 30
    finally:
        child.kill()
        child.wait()


MEASURE = """
import sys, time
from pathlib import Path
from backend_stub.config import ExportTypeConfig
from backend_stub.export_job import ExportJob
from tests.test_sql_source import job
url, rows, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": url, "table": "big", "key": "id"},
                                        "filters": {"upto": {"type": "integer", "column": "id", "op": "lte"}}})
spec.source.check_at_load(spec.filters)
job(spec, out, "csv", {"upto": 20_000}).run()  # warm: every code path loaded, pools and buffers made
Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from the current RSS
status = lambda key: int(next(l for l in Path("/proc/self/status").read_text().splitlines()
                              if l.startswith(key)).split()[1])
before = status("VmRSS:")
assert job(spec, out, "csv", {"upto": rows}).run().rows == rows
print(status("VmHWM:") - before)
"""


def test_memory_stays_flat_whatever_the_row_count(pg_database: SqlDatabase, tmp_path: Path) -> None:
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE big AS SELECT g AS id, md5(g::text) AS note "
                             "FROM generate_series(1, 400000) AS g")
        conn.exec_driver_sql("ALTER TABLE big ADD PRIMARY KEY (id)")
    engine.dispose()

    def growth_kib(rows: int) -> int:
        done = subprocess.run([sys.executable, "-c", MEASURE, pg_database.url, str(rows), str(tmp_path)],
                              cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    small, large = growth_kib(100_000), growth_kib(400_000)
    assert large - small < 8 * 1024, (small, large)  # 4x the rows, the same memory: no growth per row
    assert large < 40 * 1024, large


def test_a_sqlite_table_exports_through_the_same_source(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data.db'}"
    engine = sql.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, tenant TEXT, v TEXT)")
        conn.exec_driver_sql("INSERT INTO t VALUES (2, 'acme', ''), (1, 'acme', 'a,b'), (3, 'globex', 'x')")
    engine.dispose()
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": url, "table": "t", "key": "id",
                                                       "tenant_column": "tenant"},
                                            "filters": {"v": {"type": "string", "column": "v"}}})
    assert isinstance(spec.source, SqlSource)
    assert spec.source.check_at_load(spec.filters) == []
    assert run(spec, tmp_path, "csv")[0] == b'id,tenant,v\r\n1,acme,"a,b"\r\n2,acme,""\r\n'
    assert run(spec, tmp_path, "csv", {"v": "a,b"})[0] == b'id,tenant,v\r\n1,acme,"a,b"\r\n'


def test_a_backend_serves_sql_types_and_retries_one_whose_database_is_down(
        services: Callable[..., Service], pg_database: SqlDatabase, tmp_path: Path) -> None:
    """Through a real backend process: a tenant's Parquet file, and a type that loaded unchecked failing retryably."""
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE sales (id INTEGER PRIMARY KEY, tenant TEXT, amount NUMERIC(12,2))")
        conn.exec_driver_sql("INSERT INTO sales VALUES (1, 't1', 10.50), (2, 't2', 99.99), (3, 't1', 0.01)")
    engine.dispose()
    down = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/nowhere"
    backend = services("backend_stub", backend_config(tmp_path, export_types={
        "sales": {"source": {"kind": "sql", "url": pg_database.url, "table": "sales", "key": "id",
                             "tenant_column": "tenant"}, "formats": ["parquet", "csv"]},
        "down": {"source": {"kind": "sql", "url": down, "table": "t", "key": "id", "tenant_column": "tenant"},
                 "max_attempts": 2}}))
    log = backend.log()
    assert "export type down was not checked" in log and "hunter2" not in log and down not in log
    created = backend_create(backend.url, {"export_type": "sales"})
    assert created.status_code == 201, created.text
    done = wait_status(backend.url, created.json()["data"]["task_id"], timeout=60)
    assert done["status"] == "COMPLETED" and done["result"]["format"] == "parquet", done
    file = httpx.get(f"{backend.url}{done['result']['download_url']}", headers=backend_headers(), timeout=30)
    assert file.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(file.content))
    assert table.to_pylist() == [{"id": 1, "tenant": "t1", "amount": Decimal("10.50")},
                                 {"id": 3, "tenant": "t1", "amount": Decimal("0.01")}]
    failing = backend_create(backend.url, {"export_type": "down"})
    assert failing.status_code == 201, failing.text
    ended = wait_status(backend.url, failing.json()["data"]["task_id"], timeout=60)
    assert ended["status"] == "FAILED" and ended["attempt"] == 2, ended
    assert ended["error"]["code"] == "EXPORT_FAILED" and "could not be used" in ended["error"]["message"]
    assert "hunter2" not in json.dumps(ended) and str(down.split("@")[1]) not in json.dumps(ended)
