"""What every output format provides: a streaming row writer over the attempt's binary output file."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, Protocol

ColumnKind = Literal["boolean", "integer", "float", "decimal", "string", "date", "time", "timestamp",
                     "timestamptz", "binary", "json", "unknown"]


@dataclass(frozen=True)
class ColumnType:
    """A column's type as its source knows it (a database's), for formats that store types (Parquet).

    `decimal` with a precision is DECIMAL(precision, scale); without one, an unbounded numeric.
    `unknown`: the writer tells from the values."""

    kind: ColumnKind
    precision: int | None = None
    scale: int | None = None


@dataclass(frozen=True)
class WriteOptions:
    """The export type's settings that change how rows are written, and the column types the source knows."""

    escape_formulas: bool = False  # CSV: a text cell starting with = + - @ gets a leading '
    column_types: Sequence[ColumnType] | None = None  # None: the source does not say (writers infer)


class RowWriter(Protocol):
    """Writes batches as they come (bounded memory), then `close()` ends the format (a footer, a flush).

    The output stream stays open: the caller owns it, compression and size accounting included."""

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OutputFormat:
    """One format, as a submit names it: its file extension is its name."""

    name: str
    media_type: str
    open: Callable[[BinaryIO, Sequence[str], WriteOptions], RowWriter]  # (output, columns, options)
    # the writer takes dates, timestamps and decimals as their output text too (a declared decimal column's as str)
    text_values: bool = False
