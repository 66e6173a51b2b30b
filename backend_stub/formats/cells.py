"""What a value becomes in a result file: the output rules every format shares.

NULL is an empty CSV field and JSON null; dates are YYYY-MM-DD; timestamps with a
time zone are written in UTC with a `Z`, without one with no offset; decimals keep
their exact digits, never going through a float (in JSON a number with those
digits); binary is base64; booleans are true and false; a JSON column's value is its JSON
text. Anything else is its str().
"""
from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from types import NoneType
from typing import Any

import orjson


def timestamp_text(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        return value.isoformat()
    written = value.isoformat()
    if written.endswith("+00:00"):  # already in UTC (what a database session set to UTC returns)
        return written[:-6] + "Z"
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def decimal_text(value: Decimal) -> str:
    """Every digit the value holds, positionally (1E+2 is 100): no exponent for a reader to misread."""
    return format(value, "f")


def text(value: Any) -> str | None:
    """A value as a CSV field's text; None stays None (NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, datetime):
        return timestamp_text(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return decimal_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict | list):  # a JSON column's value: its JSON text
        return orjson.dumps(value, default=json_value).decode()
    return str(value)


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


# the converter of each exact type a database driver returns: one dictionary look-up instead of a chain of checks
_TEXT_OF: dict[type, Callable[[Any], str]] = {
    str: str.__str__, int: int.__repr__, float: float.__repr__, bool: _bool_text, datetime: timestamp_text,
    date: date.isoformat, time: time.isoformat, Decimal: decimal_text,
}


_JSON_NATIVE = frozenset({str, int, float, bool, NoneType})


def column_text(kinds: set[type]) -> Callable[[Any], str | None]:
    """The converter for a column holding values of these types (NoneType among them or not)."""
    found = [_TEXT_OF.get(kind) for kind in kinds if kind is not NoneType]
    if len(found) != 1 or found[0] is None:
        return text
    convert = found[0]
    return lambda value: None if value is None else convert(value)


def _decimal_json(value: Decimal) -> Any:
    return orjson.Fragment(decimal_text(value)) if value.is_finite() else decimal_text(value)


def _decimal_text_json(value: str | None) -> Any:
    """A decimal given as its text: a JSON number with those digits; NaN and the infinities stay strings."""
    return orjson.Fragment(value) if value is not None and value[-1:].isdigit() else value


def column_json(kinds: set[type], decimal: bool = False) -> Callable[[Any], Any] | None:
    """For a column holding values of these types, the converter to what orjson writes by these rules
    (None: orjson writes them as they are). `decimal`: the column is declared a decimal, its text its digits."""
    if decimal and kinds <= {str, NoneType}:
        return _decimal_text_json
    if kinds <= _JSON_NATIVE:
        return None
    if kinds <= {Decimal, NoneType}:
        return lambda value: None if value is None else _decimal_json(value)
    convert = column_text(kinds)
    return convert if convert is not text else json_value


_NON_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})  # a numeric's text that is no JSON number


def json_column(column: Sequence[Any], decimal: bool = False) -> Iterable[Any]:
    """A column's values as orjson writes them by these rules: the column itself when they are already, else
    converted (a declared decimal's texts, none of them NULL or not finite: each a JSON number, all in C)."""
    kinds = set(map(type, column))
    if decimal and kinds == {str} and _NON_FINITE.isdisjoint(column):
        return map(orjson.Fragment, column)
    convert = column_json(kinds, decimal)
    return column if convert is None else map(convert, column)


def json_value(value: Any) -> Any:
    """orjson's `default`: a value it does not write itself (dates and times are passed through to here)."""
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(decimal_text(value))
    return text(value)
