"""Filters: checked against the export type's schema, then compiled into one row predicate."""
from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any, Callable, Literal

from pydantic import Field, model_validator

from backend_stub.config_model import Strict
from backend_stub.datasets import Row
from exports_common.errors import validation_error
from exports_common.submit_body import shown_name

Predicate = Callable[[Row], bool]
_OPS = {"eq": operator.eq, "gte": operator.ge, "lte": operator.le}
_OP_WORDS = {"eq": "equals", "gte": "at least", "lte": "at most"}


class FilterSpec(Strict):
    """One filter a client may send: its type, and the column it tests."""

    type: Literal["string", "integer", "number", "date", "enum"]
    column: str = Field("", description="the column it tests; default: the filter's own name")
    op: Literal["eq", "gte", "lte"] = "eq"
    values: list[str] | None = Field(None, description="allowed values, for type enum")
    multiple: bool = Field(False, description="enum only: the client may send a list, matching any of it")

    @model_validator(mode="after")
    def _enum_has_values(self) -> FilterSpec:
        if self.type == "enum" and not self.values:
            raise ValueError("an enum filter needs a non-empty 'values' list")
        if self.multiple and self.type != "enum":  # a list's length is bounded by the values it picks from
            raise ValueError("multiple: true is for enum filters only (a list picks from their values)")
        return self


def _check_scalar(name: str, spec: FilterSpec, value: Any) -> Any:
    field = f"filters.{name}"
    if spec.type == "string":
        if not isinstance(value, str) or not (1 <= len(value) <= 256):
            raise validation_error(field, "must be a string of 1 to 256 characters")
    elif spec.type == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise validation_error(field, "must be an integer")
    elif spec.type == "number":
        finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        if isinstance(value, bool) or not finite:
            raise validation_error(field, "must be a finite number")
    elif spec.type == "date":
        if not (isinstance(value, str) and len(value) == 10 and _is_date(value)):
            raise validation_error(field, "must be a date as YYYY-MM-DD")
    elif spec.type == "enum" and value not in (spec.values or []):
        raise validation_error(field, f"must be one of {spec.values}")
    return value


def _is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
        return True
    except ValueError:
        return False


def validate_filters(specs: dict[str, FilterSpec], raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise validation_error("filters", "must be a JSON object")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        spec = specs.get(name)
        if spec is None:
            raise validation_error(f"filters.{shown_name(name)}", f"unknown filter; allowed: {sorted(specs)}")
        if spec.multiple and isinstance(value, list):
            if not value:
                raise validation_error(f"filters.{name}", "must not be an empty list")
            out[name] = _distinct(name, spec, value)
        else:
            out[name] = _check_scalar(name, spec, value)
    return out


def _distinct(name: str, spec: FilterSpec, values: list[Any]) -> list[Any]:
    """A list filter's values, each checked and none twice: so a list is never longer than the enum it picks from
    (each value is a bound parameter of the source's query, and a database caps how many one statement takes)."""
    checked: list[Any] = []
    for value in values:
        item = _check_scalar(name, spec, value)
        if item in checked:
            raise validation_error(f"filters.{name}", f"lists {item!r} more than once")
        checked.append(item)
    return checked


def _scalar_schema(spec: FilterSpec) -> dict[str, Any]:
    """The JSON Schema of one value, saying exactly what `_check_scalar` accepts."""
    if spec.type == "string":
        return {"type": "string", "minLength": 1, "maxLength": 256}
    if spec.type == "date":
        return {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
    if spec.type == "enum":
        return {"type": "string", "enum": list(spec.values or [])}
    return {"type": spec.type}


def filters_schema(specs: dict[str, FilterSpec]) -> dict[str, Any]:
    """The JSON Schema of an export type's `filters` object, generated from the same specs that check it."""
    properties: dict[str, Any] = {}
    for name, spec in specs.items():
        scalar = _scalar_schema(spec)
        described = "any of" if spec.multiple else _OP_WORDS[spec.op]
        listed = {"type": "array", "items": scalar, "minItems": 1, "maxItems": len(spec.values or []),
                  "uniqueItems": True}
        schema = {"anyOf": [scalar, listed]} if spec.multiple else scalar
        properties[name] = {**schema, "description": f"rows whose {spec.column} {described} this value"}
    return {"type": "object", "additionalProperties": False, "properties": properties}


def _one(index: int, spec: FilterSpec, value: Any) -> Predicate:
    if isinstance(value, list):
        allowed = frozenset(value)
        return lambda row: row[index] in allowed
    compare = _OPS[spec.op]
    return lambda row: compare(row[index], value)


def compile_filters(specs: Mapping[str, FilterSpec], columns: Sequence[str],
                    filters: Mapping[str, Any]) -> Predicate | None:
    """One predicate for all filters, or None when nothing filters (the fast path)."""
    predicates = [_one(columns.index(specs[name].column), specs[name], value) for name, value in filters.items()]
    if not predicates:
        return None
    if len(predicates) == 1:
        return predicates[0]
    return lambda row: all(p(row) for p in predicates)

