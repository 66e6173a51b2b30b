"""The shape of a submit body, checked the same way at the edge and in the backend."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Collection
from urllib.parse import urlsplit

from exports_common.contract import FORMAT_PATTERN
from exports_common.errors import validation_error
from exports_common.netpolicy import host_name_problem

FIELDS = frozenset({"export_type", "filters", "callback_url", "timeout_sec", "format"})


@dataclass(frozen=True)
class SubmitBody:
    export_type: str
    filters: Any
    callback_url: str | None
    timeout_sec: int
    format: str | None  # None: the export type's first format


def shown_name(name: str) -> str:
    """A client's member name as an error echoes it: at most 64 characters."""
    return name if len(name) <= 64 else name[:64] + "..."


def check_timeout(value: Any, max_timeout_sec: int, field: str = "timeout_sec") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_timeout_sec:
        raise validation_error(field, f"must be an integer from 1 to {max_timeout_sec}")
    return value


def check_format(value: Any, field: str = "format") -> str:
    """The shape of a format name; whether the export type offers it is for the backend to say."""
    if not isinstance(value, str) or FORMAT_PATTERN.fullmatch(value) is None:
        raise validation_error(field, "must be the name of a format the export type offers, such as csv or jsonl")
    return value


def check_callback_url(value: Any) -> str | None:
    """Syntax only; whether the address may be called is netpolicy's question."""
    if value is None:
        return None
    parts = None
    if isinstance(value, str) and len(value) <= 2048 and value.isprintable():
        try:
            parts = urlsplit(value)
            _ = parts.port  # raises ValueError on a bad port
        except ValueError:
            parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise validation_error("callback_url", "must be an absolute http(s) URL of at most 2048 characters")
    if problem := host_name_problem(parts.hostname):
        raise validation_error("callback_url", problem)
    return str(value)


def check_submit_body(
    body: Any, export_types: Collection[str] | None, max_timeout_sec: int, default_timeout_sec: int,
    max_filters_bytes: int,
) -> SubmitBody:
    if not isinstance(body, dict):
        raise validation_error("body", "must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise validation_error(shown_name(unknown[0]), f"unknown field; allowed: {sorted(FIELDS)}")
    export_type = body.get("export_type")
    if not isinstance(export_type, str) or (export_types is not None and export_type not in export_types):
        allowed = f"one of {sorted(export_types)}" if export_types is not None else "a string"
        raise validation_error("export_type", f"must be {allowed}")
    filters = body.get("filters")
    if filters is not None:
        if not isinstance(filters, dict):
            raise validation_error("filters", "must be a JSON object")
        if len(json.dumps(filters)) > max_filters_bytes:
            raise validation_error("filters", f"must be at most {max_filters_bytes} bytes as JSON")
    return SubmitBody(
        export_type=export_type,
        filters=filters,
        callback_url=check_callback_url(body.get("callback_url")),
        timeout_sec=check_timeout(body.get("timeout_sec", default_timeout_sec), max_timeout_sec),
        format=check_format(body["format"]) if "format" in body else None,
    )
