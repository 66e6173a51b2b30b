"""A result's column types, from the driver's cursor description (psycopg 3, PyMySQL, sqlite3).

Formats that store types (Parquet) write what the database declares: DECIMAL(p,s) stays a
decimal of that precision, an unbounded numeric a string, timestamptz a UTC timestamp. A type
this module does not know is `unknown`, and the writer tells from the values.
"""
from __future__ import annotations

from typing import Any

from backend_stub.formats.base import ColumnKind, ColumnType

# PostgreSQL type OIDs (pg_type)
_PG_KINDS: dict[int, ColumnKind] = {
    16: "boolean", 20: "integer", 21: "integer", 23: "integer", 26: "integer", 700: "float", 701: "float",
    1700: "decimal", 1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 17: "binary",
    25: "string", 1043: "string", 1042: "string", 19: "string", 2950: "string", 114: "json", 3802: "json",
}
# MySQL protocol field types (pymysql.constants.FIELD_TYPE); TIME comes as a timedelta (it may exceed a day),
# text and blob types share codes (the values tell)
_MYSQL_KINDS: dict[int, ColumnKind] = {
    1: "integer", 2: "integer", 3: "integer", 8: "integer", 9: "integer", 13: "integer",  # TINY..LONGLONG, YEAR
    4: "float", 5: "float", 0: "decimal", 246: "decimal", 10: "date", 14: "date",
    12: "timestamp", 7: "timestamptz",  # DATETIME; TIMESTAMP, which is stored in UTC
    245: "json",
}


def column_types(name: str, cursor: Any) -> list[ColumnType]:
    """The types of a result's columns, from the driver's cursor (after execute) of the dialect `name`."""
    description = cursor.description or ()
    if name == "postgresql":
        return [_pg_type(column) for column in description]
    if name in ("mysql", "mariadb"):
        return [_mysql_type(column) for column in description]
    return [ColumnType("unknown") for _ in description]


def _pg_type(column: Any) -> ColumnType:
    kind = _PG_KINDS.get(column.type_code, "unknown")
    if kind == "decimal" and column.precision is not None:
        return ColumnType("decimal", column.precision, column.scale or 0)
    return ColumnType(kind)


def _mysql_type(column: tuple[Any, ...]) -> ColumnType:
    """The server describes a DECIMAL(p,s) by its display length: p digits, a point when s > 0, and a sign
    unless the column is UNSIGNED. PyMySQL's public description has no UNSIGNED flag, so the length less the
    point is the precision: exact for an UNSIGNED column, one digit more than declared for a signed one, and
    never too few for a value the column holds."""
    kind = _MYSQL_KINDS.get(column[1], "unknown")
    if kind == "decimal":
        scale = column[5] or 0
        return ColumnType("decimal", max(1, column[4] - (1 if scale else 0)), scale)
    return ColumnType(kind)
