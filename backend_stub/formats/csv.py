"""CSV: a header of column names, then one record per row (RFC 4180 quoting, CRLF line ends).

NULL is an empty unquoted field and an empty string is `""`; quoting is otherwise
minimal. Batches of plain values (int, float, non-empty str, None) go straight to the
csv module; a column holding anything else is converted first (cells), and a row
holding an empty string is written by hand, as the csv module cannot tell it from NULL.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, BinaryIO

from backend_stub.formats import cells
from backend_stub.formats.base import OutputFormat, WriteOptions

_NONE = type(None)
_PLAIN = frozenset({int, float, str, _NONE})
FORMULA_STARTS = ("=", "+", "-", "@")
_NEEDS_QUOTES = frozenset(',"\r\n')


def _defused(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula, made text with a leading quote."""
    return "'" + value if value.__class__ is str and value.startswith(FORMULA_STARTS) else value


def _field(value: Any) -> str:
    """One field as the csv module's minimal quoting writes it, except that "" is quoted and NULL is not."""
    if value is None:
        return ""
    if value == "":
        return '""'
    field = value if value.__class__ is str else repr(value)
    if _NEEDS_QUOTES.isdisjoint(field):
        return field
    return '"' + field.replace('"', '""') + '"'


class CsvWriter:
    def __init__(self, out: BinaryIO, columns: Sequence[str], options: WriteOptions) -> None:
        self._text = io.TextIOWrapper(out, encoding="utf-8", newline="")
        self._records = csv.writer(self._text)
        self._escape = options.escape_formulas
        self._one_column = len(columns) == 1
        self.write([tuple(columns)])

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        kinds = [set(map(type, column)) for column in columns]
        if not all(k <= _PLAIN for k in kinds):  # only the columns of other types are converted to text
            columns = [column if k <= _PLAIN else tuple(map(cells.column_text(k), column))
                       for column, k in zip(columns, kinds, strict=True)]
            kinds = [k if k <= _PLAIN else {str, _NONE} for k in kinds]
            rows = list(zip(*columns, strict=True))
        if self._escape and any(str in k for k in kinds):
            rows = [tuple(map(_defused, row)) for row in rows]
        empty = any(str in k and "" in column for k, column in zip(kinds, columns, strict=True))
        if empty or (self._one_column and _NONE in kinds[0]):
            self._write_by_hand(rows)
        else:
            self._records.writerows(rows)

    def _write_by_hand(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Rows the csv module would write ambiguously by hand, the others through it, in order."""
        plain: list[tuple[Any, ...]] = []
        for row in rows:
            if "" in row or (self._one_column and row[0] is None):  # a lone NULL: csv would write ""
                self._records.writerows(plain)
                plain.clear()
                self._text.write(",".join(map(_field, row)) + "\r\n")
            else:
                plain.append(row)
        self._records.writerows(plain)

    def close(self) -> None:
        self._text.flush()
        self._text.detach()  # the output stream stays open: it belongs to the caller


FORMAT = OutputFormat("csv", "text/csv; charset=utf-8", CsvWriter, text_values=True)
