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

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME
# A batch is one orjson call (a call per row costs several times more): the rows as one JSON array with this
# raw line break between them. orjson writes a line break inside a string as \n, so a raw one is only this.
_ROW_END = orjson.Fragment(b"\n")


class JsonlWriter:
    def __init__(self, out: BinaryIO, columns: Sequence[str], options: WriteOptions) -> None:
        self._out = out
        self._columns = tuple(columns)
        types = options.column_types or ()
        self._decimal = [t.kind == "decimal" for t in types] if len(types) == len(columns) else [False] * len(columns)

    def _lines(self, rows: Sequence[Sequence[Any]]) -> bytes:
        columns = self._columns
        array = orjson.dumps([item for row in rows for item in (dict(zip(columns, row, strict=True)), _ROW_END)],
                             default=cells.json_value, option=_OPTIONS)
        # [{...},\n,{...},\n] -> {...}\n{...}\n
        return array[1:-3].replace(b",\n,", b"\n") + b"\n"

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:  # columns of types orjson does not write by the output rules are converted first, a column at once
            columns = list(zip(*rows, strict=True))
            converted = [cells.json_column(column, decimal) for column, decimal in zip(columns, self._decimal,
                                                                                      strict=True)]
            if any(new is not old for new, old in zip(converted, columns, strict=True)):
                rows = list(zip(*converted, strict=True))
        if not rows:
            return
        try:
            lines = self._lines(rows)
        except orjson.JSONEncodeError:  # an integer wider than 64 bits, which orjson does not pass to `default`
            lines = self._lines([tuple(map(_wide_int, row)) for row in rows])
        self._out.write(lines)

    def close(self) -> None:
        pass


def _wide_int(value: Any) -> Any:
    return orjson.Fragment(int.__repr__(value)) if value.__class__ is int and value.bit_length() > 63 else value


FORMAT = OutputFormat("jsonl", "application/x-ndjson", JsonlWriter, text_values=True)
