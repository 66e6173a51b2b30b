"""PostgreSQL values as the text formats write them, made from the server's own text (no Python object between).

With the session's DateStyle ISO and TimeZone UTC, the server already writes a numeric with its exact
digits (never an exponent), a date as YYYY-MM-DD, and a timestamp as `YYYY-MM-DD HH:MM:SS[.f]`, with
`+00` for a timestamptz. The output rules (formats.cells) want the same with a `T`, six fraction
digits when there is a fraction, and `Z` for UTC: a string edit, no date parsing. A value outside
that shape (BC, infinity, a year past 9999) goes through psycopg's own loader and the same rules as
any other value, so the result, or the error, is what it would be without these loaders.

Registered on one cursor (`register`), for the CSV and JSONL formats only: Parquet keeps the typed
values. A numeric column's values are then `str`; the writers know it is a decimal from its type.
"""
from __future__ import annotations

from datetime import date
from typing import Any

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader
from psycopg.types.string import TextLoader

from backend_stub.formats import cells

_DATE_LEN = len("2026-01-01")
_SECONDS_END = len("2026-01-01 00:00:00")
_FRACTION_LEN = len(".000000")


def _iso(text: str, end: int) -> str | None:
    """`YYYY-MM-DD HH:MM:SS[.f]` (up to `end`) as isoformat() writes it, or None for another shape."""
    if len(text) < _SECONDS_END or end < _SECONDS_END or text[4] != "-" or text[10] != " ":
        return None
    fraction = text[_SECONDS_END:end]
    if fraction and (fraction[0] != "." or len(fraction) > _FRACTION_LEN):
        return None
    return f"{text[:_DATE_LEN]}T{text[_DATE_LEN + 1:_SECONDS_END]}{fraction and fraction.ljust(_FRACTION_LEN, '0')}"


class _Text(Loader):
    """A loader of the text the output rules want; `typed` is psycopg's loader for a value of another shape."""

    typed: type[Loader]

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._typed = self.typed(oid, context)


class DateText(_Text):
    typed = DateLoader

    def load(self, data: Buffer) -> str:
        text = bytes(data).decode()
        if len(text) == _DATE_LEN and text[4] == "-":
            return text
        value: date = self._typed.load(data)
        return value.isoformat()


class TimestampText(_Text):
    typed = TimestampLoader

    def load(self, data: Buffer) -> str:
        text = bytes(data).decode()
        return _iso(text, len(text)) or cells.timestamp_text(self._typed.load(data))


class TimestamptzText(_Text):
    typed = TimestamptzLoader

    def load(self, data: Buffer) -> str:
        text = bytes(data).decode()
        if len(text) == _SECONDS_END + 3 and text[_SECONDS_END:] == "+00" and text[10] == " " and text[4] == "-":
            return f"{text[:_DATE_LEN]}T{text[_DATE_LEN + 1:_SECONDS_END]}Z"  # whole seconds: the common case
        written = _iso(text, len(text) - 3) if text.endswith("+00") else None
        return written + "Z" if written is not None else cells.timestamp_text(self._typed.load(data))


def register(cursor: Any) -> None:
    """Load this cursor's numeric, date, timestamp and timestamptz values as their output text."""
    adapters = cursor.adapters
    adapters.register_loader("numeric", TextLoader)
    adapters.register_loader("date", DateText)
    adapters.register_loader("timestamp", TimestampText)
    adapters.register_loader("timestamptz", TimestamptzText)
