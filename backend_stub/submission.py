"""Validation of what a caller may send: the create body and the re-run overrides."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from backend_stub.config import BackendConfig
from backend_stub.filters import validate_filters
from exports_common.errors import validation_error

FORMATS = ("csv", "jsonl")
_CREATE_FIELDS = {"export_type", "filters", "callback_url", "timeout_sec", "format"}


@dataclass(frozen=True)
class Submission:
    export_type: str
    filters: dict[str, Any]
    callback_url: str | None
    timeout_sec: int
    format: str

    def fingerprint(self, tenant: str) -> str:
        canonical = json.dumps([tenant, self.export_type, self.filters, self.callback_url, self.timeout_sec,
                                self.format], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _timeout(value: Any, config: BackendConfig, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= config.max_timeout_sec:
        raise validation_error(field, f"must be an integer from 1 to {config.max_timeout_sec}")
    return value


def _format(value: Any, field: str) -> str:
    if value not in FORMATS:
        raise validation_error(field, f"must be one of {list(FORMATS)}")
    return value


def check_callback_url(value: Any) -> str | None:
    """Syntax only: whether the address is public is decided where it is resolved."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 2048:
        raise validation_error("callback_url", "must be an absolute http(s) URL of at most 2048 characters")
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise validation_error("callback_url", "must be an absolute http(s) URL")
    return value


def parse_submission(body: Any, config: BackendConfig) -> Submission:
    if not isinstance(body, dict):
        raise validation_error("body", "must be a JSON object")
    unknown = set(body) - _CREATE_FIELDS
    if unknown:
        raise validation_error(sorted(unknown)[0], f"unknown field; allowed: {sorted(_CREATE_FIELDS)}")
    export_type = body.get("export_type")
    if export_type not in config.export_types:
        raise validation_error("export_type", f"must be one of {sorted(config.export_types)}")
    filters_raw = body.get("filters")
    if filters_raw is not None and len(json.dumps(filters_raw)) > config.max_filters_bytes:
        raise validation_error("filters", f"must be at most {config.max_filters_bytes} bytes as JSON")
    return Submission(
        export_type=export_type,
        filters=validate_filters(config.export_types[export_type].filters, filters_raw),
        callback_url=check_callback_url(body.get("callback_url")),
        timeout_sec=_timeout(body.get("timeout_sec", config.default_timeout_sec), config, "timeout_sec"),
        format=_format(body.get("format", "csv"), "format"),
    )


def parse_rerun(body: Any, config: BackendConfig) -> tuple[int, dict[str, Any]]:
    """`{"expected_attempt": n, "overrides": {"timeout_sec", "format", "degraded"}}`."""
    if not isinstance(body, dict):
        raise validation_error("body", "must be a JSON object")
    expected = body.get("expected_attempt")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise validation_error("expected_attempt", "must be an integer >= 1")
    raw = body.get("overrides") or {}
    if not isinstance(raw, dict):
        raise validation_error("overrides", "must be a JSON object")
    overrides: dict[str, Any] = {}
    for key, value in raw.items():
        field = f"overrides.{key}"
        if key == "timeout_sec":
            overrides[key] = _timeout(value, config, field)
        elif key == "format":
            overrides[key] = _format(value, field)
        elif key == "degraded":
            if not isinstance(value, bool):
                raise validation_error(field, "must be true or false")
            overrides[key] = value
        else:
            raise validation_error(field, "unknown override; allowed: timeout_sec, format, degraded")
    return expected, overrides
