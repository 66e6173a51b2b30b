"""What a caller may send the backend: the create body (per export type) and re-run overrides."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend_stub.config import BackendConfig, ExportTypeConfig
from backend_stub.filters import validate_filters
from exports_common.errors import validation_error
from exports_common.submit_body import check_format, check_submit_body, check_timeout


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


def parse_submission(body: Any, config: BackendConfig, types: Mapping[str, ExportTypeConfig]) -> Submission:
    """`body` checked against the export types in force (`types`, the registry's)."""
    shape = check_submit_body(body, types.keys(), config.max_timeout_sec, config.default_timeout_sec,
                              config.max_filters_bytes)
    spec = types[shape.export_type]
    return Submission(
        export_type=shape.export_type,
        filters=validate_filters(spec.filters, shape.filters),
        callback_url=shape.callback_url,
        timeout_sec=shape.timeout_sec,
        format=offered_format(shape.export_type, spec, shape.format),
    )


def offered_format(export_type: str, spec: ExportTypeConfig | None, fmt: str | None,
                   field: str = "format") -> str:
    """`fmt` if the type offers it; the type's first format when none is named."""
    offered = spec.formats if spec is not None else []
    if fmt is None and offered:
        return offered[0]
    if fmt not in offered:
        raise validation_error(field, f"export type {export_type} offers {', '.join(offered) or 'no format now'}")
    return fmt


def parse_active_quota(raw: str | None) -> int | None:
    """`X-Tenant-Max-Active-Tasks`, set by the gateway from the tenant's limits; absent: no quota."""
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # isdigit alone takes '²', which int() refuses
        raise validation_error("X-Tenant-Max-Active-Tasks", "header must be a whole number >= 1")
    return int(raw)


def parse_rerun(body: Any, config: BackendConfig, export_type: str,
                spec: ExportTypeConfig | None) -> tuple[int, dict[str, Any]]:
    """`{"expected_attempt": n, "overrides": {"timeout_sec", "format", "degraded"}}`; `spec`: the type the task
    was created under."""
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
            overrides[key] = check_timeout(value, config.max_timeout_sec, field)
        elif key == "format":
            overrides[key] = offered_format(export_type, spec, check_format(value, field), field)
        elif key == "degraded":
            if not isinstance(value, bool):
                raise validation_error(field, "must be true or false")
            overrides[key] = value
        else:
            raise validation_error(field, "unknown override; allowed: timeout_sec, format, degraded")
    return expected, overrides
