"""CSV and JSONL from PostgreSQL's own text of numerics, dates and timestamps: byte for byte what the typed rows give.

The text formats read these columns as the server writes them (no Python object per value); Parquet
reads them typed. Both are written here from the same table and compared, for the shapes the server
writes (fractions of every length, no fraction, the first and last dates Python knows, NaN and
infinite numerics, a decimal column without NULL, formula-like negatives), and a value Python
cannot hold fails the same way.
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from backend_stub.config import ExportTypeConfig
from backend_stub.failures import PermanentFailure
from backend_stub.formats import FORMATS, WriteOptions
from backend_stub.sources.sql import SqlSource
from tests.databases import SqlDatabase
from tests.test_sql_source import Ctx, engine_of, run

VALUES = """INSERT INTO v VALUES
 (1, 12.50, 0, 1.5, '2026-01-01', '2026-01-01 00:00:00', '2026-01-01 00:00:00+00'),
 (2, -0.000001, 123456789012345678901234567890.123456789, -2.250, '0001-01-01', '2026-02-28 23:59:58.5',
  '2026-03-01 01:02:03.5+01'),
 (3, 99999999999999.999999, 'NaN', 0, '9999-12-31', '1999-12-31 23:59:59.000001', '1970-01-01 00:00:00.123456+00'),
 (4, NULL, 'Infinity', 99999.999, NULL, NULL, NULL),
 (5, 0, '-Infinity', -0.001, '2024-02-29', '2024-02-29 12:00:00.12', '2024-02-29 12:00:00.1-07:30')"""


def create(database: SqlDatabase) -> SqlSource:
    engine = engine_of(database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE v (id INTEGER PRIMARY KEY, n NUMERIC(20,6), u NUMERIC, "
                             "k NUMERIC(8,3) NOT NULL, d DATE, ts TIMESTAMP, tz TIMESTAMPTZ)")
        conn.exec_driver_sql(VALUES)
    engine.dispose()
    source = SqlSource.model_validate({"kind": "sql", "url": database.url, "table": "v", "key": "id"})
    source.check_at_load({})
    return source


def written(source: SqlSource, fmt: str, text_values: bool, escape: bool) -> bytes:
    out = io.BytesIO()
    rows = source.open_text_values(Ctx(), {}) if text_values else source.open(Ctx(), {})
    with rows:
        writer = FORMATS[fmt].open(out, rows.columns, WriteOptions(escape, rows.column_types()))
        for batch in rows.batches():
            if text_values:  # the text path is the one taken: no Python date or Decimal in the rows
                assert all(value is None or type(value) in (int, str) for row in batch for value in row)
            writer.write(batch)
        writer.close()
    return out.getvalue()


def test_text_values_write_the_same_bytes_as_typed_values(pg_database: SqlDatabase) -> None:
    source = create(pg_database)
    for fmt in ("csv", "jsonl"):
        for escape in (False, True):
            typed = written(source, fmt, text_values=False, escape=escape)
            assert written(source, fmt, text_values=True, escape=escape) == typed, (fmt, escape)
            assert b"2026-03-01T00:02:03.500000Z" in typed and b"1999-12-31T23:59:59.000001" in typed


def test_a_value_python_cannot_hold_fails_the_export_as_before(pg_database: SqlDatabase, tmp_path: Path) -> None:
    engine = engine_of(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE far (id INTEGER PRIMARY KEY, tz TIMESTAMPTZ)")
        conn.exec_driver_sql("INSERT INTO far VALUES (1, '0044-03-15 12:00:00+00 BC')")
    engine.dispose()
    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": pg_database.url, "table": "far",
                                                       "key": "id"}, "formats": ["csv", "parquet"]})
    assert isinstance(spec.source, SqlSource)
    spec.source.check_at_load({})
    for fmt in ("csv", "parquet"):
        with pytest.raises(PermanentFailure, match="BC"):
            run(spec, tmp_path, fmt)
