"""JSON Lines: one object per row, keyed by column name, in column order; UTF-8, LF line ends.

Integers and floats are JSON numbers, decimals JSON numbers with their exact digits,
NULL is null; other values follow the shared output rules (cells).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, BinaryIO

import orjson

from backend_stub.formats import cells
from backend_stub.formats.base import OutputFormat, WriteOptions

_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATETIME


class JsonlWriter:
    def __init__(self, out: BinaryIO, columns: Sequence[str], options: WriteOptions) -> None:
        self._out = out
        self._columns = tuple(columns)

    def _line(self, row: tuple[Any, ...]) -> bytes:
        return orjson.dumps(dict(zip(self._columns, row, strict=True)), default=cells.json_value, option=_OPTIONS)

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:  # columns of types orjson does not write by the output rules are converted first, a column at once
            columns = list(zip(*rows, strict=True))
            converters = [cells.column_json(set(map(type, column))) for column in columns]
            if any(converters):
                rows = list(zip(*(column if convert is None else map(convert, column)
                                  for column, convert in zip(columns, converters, strict=True)), strict=True))
        try:
            lines = list(map(self._line, rows))
        except orjson.JSONEncodeError:  # an integer wider than 64 bits, which orjson does not pass to `default`
            lines = [self._line(tuple(map(_wide_int, row))) for row in rows]
        self._out.write(b"".join(lines))

    def close(self) -> None:
        pass


def _wide_int(value: Any) -> Any:
    return orjson.Fragment(int.__repr__(value)) if value.__class__ is int and value.bit_length() > 63 else value


FORMAT = OutputFormat("jsonl", "application/x-ndjson", JsonlWriter)
