"""Parquet through pyarrow: rows buffered into row groups of 64k rows, each written as it fills.

pyarrow is imported on the first Parquet file, not when the backend starts.

Columns keep the source's types where it declares them (a database's: DECIMAL(p,s) as
decimal128(p,s), an unbounded numeric as a string with its exact digits, timestamptz as
timestamp[us, UTC], timestamp as timestamp[us], bytea/BLOB as binary, JSON as its text).
A column of unknown type takes the type of its first non-null value in the first batch
(a decimal there is written as its exact digits, text; a column that is only NULL is text).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson

from backend_stub.formats import cells
from backend_stub.formats.base import ColumnType, OutputFormat, WriteOptions

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

ROW_GROUP_ROWS = 65_536
_MAX_DECIMAL128_DIGITS = 38



def _fixed(kind: str) -> pa.DataType:
    import pyarrow as pa

    return {"boolean": pa.bool_(), "integer": pa.int64(), "float": pa.float64(), "string": pa.string(),
            "date": pa.date32(), "time": pa.time64("us"), "timestamp": pa.timestamp("us"),
            "timestamptz": pa.timestamp("us", tz="UTC"), "binary": pa.binary(), "json": pa.string()}[kind]


def _as_text(value: Any) -> Any:
    return value if value is None or value.__class__ is str else cells.text(value)


def _as_json_text(value: Any) -> Any:
    if value is None or value.__class__ is str:
        return value
    return orjson.dumps(value, default=cells.json_value).decode()


def _declared(column: ColumnType) -> tuple[pa.DataType, Callable[[Any], Any] | None]:
    """The Arrow type of a declared column, and how a value is converted first (None: as it is)."""
    import pyarrow as pa

    if column.kind == "decimal":
        if column.precision is None:
            return pa.string(), _as_text
        if column.precision <= _MAX_DECIMAL128_DIGITS:
            return pa.decimal128(column.precision, column.scale or 0), None
        return pa.decimal256(min(column.precision, 76), column.scale or 0), None
    if column.kind == "json":
        return pa.string(), _as_json_text
    if column.kind == "string":
        return pa.string(), _as_text
    return _fixed(column.kind), None


def _inferred(values: Sequence[Any]) -> tuple[pa.DataType, Callable[[Any], Any] | None]:
    """The type of a column of unknown type, from its first non-null value."""
    import pyarrow as pa

    first = next((v for v in values if v is not None), None)
    if first is None or isinstance(first, str | Decimal):
        return pa.string(), _as_text
    if isinstance(first, dict | list):
        return pa.string(), _as_json_text
    try:
        return pa.array([first]).type, None
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.string(), _as_text


class ParquetWriter:
    def __init__(self, out: BinaryIO, columns: Sequence[str], options: WriteOptions) -> None:
        self._out = out
        self._names = list(columns)
        self._declared = options.column_types
        self._types: list[tuple[pa.DataType, Callable[[Any], Any] | None]] | None = None
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[tuple[Any, ...]] = []

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._pending.extend(rows)
        while len(self._pending) >= ROW_GROUP_ROWS:
            group, self._pending = self._pending[:ROW_GROUP_ROWS], self._pending[ROW_GROUP_ROWS:]
            self._write_group(group)

    def close(self) -> None:
        if self._pending or self._writer is None:
            self._write_group(self._pending)
            self._pending = []
        assert self._writer is not None
        self._writer.close()

    def _column_types(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[pa.DataType, Callable[[Any], Any] | None]]:
        if self._types is None:
            declared = self._declared
            columns = list(zip(*rows, strict=True)) if rows else [()] * len(self._names)
            self._types = [_declared(declared[i]) if declared is not None and declared[i].kind != "unknown"
                           else _inferred(columns[i]) for i in range(len(self._names))]
        return self._types

    def _write_group(self, rows: Sequence[tuple[Any, ...]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        types = self._column_types(rows)
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(self._names)
        arrays = [pa.array(list(values) if convert is None else list(map(convert, values)), type=arrow_type)
                  for values, (arrow_type, convert) in zip(columns, types, strict=True)]
        table = pa.Table.from_arrays(arrays, names=self._names)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._out, table.schema)
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)


FORMAT = OutputFormat("parquet", "application/vnd.apache.parquet", ParquetWriter)
