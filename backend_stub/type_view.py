"""What `GET /export-types` says about an export type: the fields a client needs, named one by one.

The answer is built from this allow-list, never by dumping the type's config, so nothing
of a source's configuration (a URL, credentials, query text, headers) can reach it,
whatever fields a source kind has.
"""
from __future__ import annotations

from typing import Any

from backend_stub.config import ExportTypeConfig
from backend_stub.filters import filters_schema
from exports_common.contract import ExportType


def public_type(name: str, spec: ExportTypeConfig) -> dict[str, Any]:
    return ExportType(
        export_type=name, filters_schema=filters_schema(spec.filters), formats=spec.formats,
        compression=spec.compression, max_attempts=spec.max_attempts, estimated_completion_sec=estimated_sec(spec),
    ).model_dump(mode="json")


def estimated_sec(spec: ExportTypeConfig) -> int | None:
    """The expected run time of an unfiltered export, when the source can tell its size from the config."""
    rows = spec.source.expected_rows()
    if rows is None:
        return None
    return max(1, round(rows / spec.estimated_rows_per_sec + spec.fault.delay_sec))
