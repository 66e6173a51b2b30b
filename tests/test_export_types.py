"""Export types as a backend team declares them: a source, the formats offered, compression, limits, formula
escaping; end to end through a real backend (and a real gateway, which leaves the format to the backend)."""
from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from backend_stub.datasets import DATASETS
from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import assert_envelope_error, backend_create, wait_status
from tests.procs import Service, backend_headers

TICKETS = ("tickets", 3000, 4)  # free text with formula-like openings, NULL days, empty notes
TYPES = {
    "plain_tickets": synthetic_type(*TICKETS, formats=["csv", "jsonl"]),
    "safe_tickets": synthetic_type(*TICKETS, formats=["jsonl", "csv"], csv_escape_formulas=True),
    "gzip_tickets": synthetic_type(*TICKETS, formats=["csv", "jsonl"], compression="gzip"),
    "capped_rows": synthetic_type("orders", 20_000, 1, max_rows=10_000, max_attempts=3),
    "capped_bytes": synthetic_type("orders", 20_000, 1, max_bytes=100_000, compression="gzip", max_attempts=3),
}
RISKY = ("=", "+", "-", "@")


@pytest.fixture(scope="module")
def backend(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Service:
    return module_services("backend_stub", backend_config(tmp_path_factory.mktemp("types"), export_types=TYPES),
                           name="backend")


def export(backend: Service, export_type: str, **body: Any) -> tuple[dict[str, Any], httpx.Response]:
    """The finished task and its file, as the backend serves it."""
    created = backend_create(backend.url, {"export_type": export_type, **body})
    assert created.status_code == 201, created.text
    done = wait_status(backend.url, created.json()["data"]["task_id"], timeout=60)
    assert done["status"] == "COMPLETED", done
    return done, httpx.get(f"{backend.url}{done['result']['download_url']}", headers=backend_headers(), timeout=30)


def test_a_submit_gets_the_types_first_format_unless_it_names_another_it_offers(backend: Service) -> None:
    default, file = export(backend, "safe_tickets")
    assert default["format"] == default["result"]["format"] == "jsonl"
    assert file.headers["content-type"] == "application/x-ndjson"
    assert len(file.content.splitlines()) == default["result"]["rows"] == 3000
    named, file = export(backend, "safe_tickets", format="csv")
    assert named["result"]["format"] == "csv" and file.headers["content-type"].startswith("text/csv")


@pytest.mark.parametrize("fmt,reason", [
    ("parquet", "export type plain_tickets offers csv, jsonl"),  # a format of the contract this type lacks
    ("xml", "export type plain_tickets offers csv, jsonl"),  # a name nobody writes
    ("CSV", "must be the name of a format"), (7, "must be the name of a format"), (None, "must be the name")])
def test_a_format_the_type_does_not_offer_is_422_naming_the_field(backend: Service, fmt: Any, reason: str) -> None:
    resp = backend_create(backend.url, {"export_type": "plain_tickets", "format": fmt})
    body = assert_envelope_error(resp, 422, 42200)
    assert body["data"]["field"] == "format" and reason in body["data"]["reason"], body


def test_export_types_lists_formats_and_compression_and_nothing_of_the_source(backend: Service) -> None:
    listed = httpx.get(f"{backend.url}/export-types", headers=backend_headers()).json()["data"]["items"]
    items = {t["export_type"]: t for t in listed}
    assert items["safe_tickets"]["formats"] == ["jsonl", "csv"] and items["safe_tickets"]["compression"] is None
    assert items["gzip_tickets"]["compression"] == "gzip"
    assert items["order_export"]["formats"] == ["csv", "jsonl"]
    allowed = {"export_type", "filters_schema", "formats", "compression", "max_attempts", "estimated_completion_sec"}
    assert all(set(item) <= allowed for item in items.values())
    assert not any(word in json.dumps(items) for word in ('"source"', "synthetic", '"seed"', '"dataset"'))


def test_csv_writes_null_empty_and_free_text_by_the_output_rules(backend: Service) -> None:
    _, file = export(backend, "plain_tickets")
    lines = file.content.decode().split("\r\n")
    assert lines[0] == "ticket_id,opened_on,closed_on,priority,subject,note"
    generated = list(DATASETS["tickets"].generate(TICKETS[2], TICKETS[1]))
    # an open ticket (NULL closing day) with an empty note, about refunds (no quoting needed)
    i, row = next((i, r) for i, r in enumerate(generated) if r[2] is None and r[4] == "Refund not received"
                  and r[5] == "")
    assert lines[1 + i] == f'{row[0]},{row[1]},,{row[3]},Refund not received,""'
    rows = list(csv.reader(io.StringIO(file.content.decode(), newline="")))
    assert rows[1:] == [["" if v is None else str(v) for v in row] for row in generated]


def test_csv_escape_formulas_quotes_risky_cells_and_leaves_jsonl_alone(backend: Service) -> None:
    _, plain = export(backend, "plain_tickets")
    _, safe = export(backend, "safe_tickets", format="csv")
    plain_rows = list(csv.reader(io.StringIO(plain.content.decode(), newline="")))
    safe_rows = list(csv.reader(io.StringIO(safe.content.decode(), newline="")))
    assert sum(cell.startswith(RISKY) for row in plain_rows for cell in row) > 100
    assert safe_rows == [["'" + cell if cell.startswith(RISKY) else cell for cell in row] for row in plain_rows]
    _, plain_jsonl = export(backend, "plain_tickets", format="jsonl")
    _, safe_jsonl = export(backend, "safe_tickets")
    assert safe_jsonl.content == plain_jsonl.content


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_gzip_type_stores_and_serves_the_compressed_file_as_is(backend: Service, fmt: str) -> None:
    done, file = export(backend, "gzip_tickets", format=fmt)
    _, plain = export(backend, "plain_tickets", format=fmt)
    task_id = done["task_id"]
    assert done["result"]["compression"] == "gzip" and done["result"]["format"] == fmt
    assert file.headers["content-type"] == "application/gzip" and "content-encoding" not in file.headers
    assert file.headers["content-disposition"] == f'attachment; filename="{task_id}.{fmt}.gz"'
    stored = Path(backend.config["data_dir"]) / "files" / f"{task_id}.{fmt}.gz"
    assert done["result"]["bytes"] == len(file.content) == stored.stat().st_size < len(plain.content) / 2
    assert gzip.decompress(file.content) == plain.content
    tail = httpx.get(f"{backend.url}{done['result']['download_url']}", headers=backend_headers(Range="bytes=-8"))
    assert tail.status_code == 206 and tail.content == file.content[-8:]  # ranges are of the stored bytes


@pytest.mark.parametrize("export_type,limit", [("capped_rows", "more than 10000 rows"),
                                               ("capped_bytes", "passed 100000 bytes")])
def test_an_export_past_its_limits_fails_at_once_not_retryable(backend: Service, export_type: str,
                                                                limit: str) -> None:
    task_id = backend_create(backend.url, {"export_type": export_type}).json()["data"]["task_id"]
    done = wait_status(backend.url, task_id, timeout=30)
    assert done["status"] == "FAILED" and done["attempt"] == 1 and done["result"] is None, done
    error = done["error"]
    assert error["code"] == "EXPORT_TOO_LARGE" and error["retryable"] is False
    assert limit in error["message"] and export_type in error["message"] and "narrow the filters" in error["message"]
    assert not list((Path(backend.config["data_dir"]) / "files").glob(f"{task_id}*"))


def test_the_gateway_leaves_the_format_to_the_backend(backend: Service, services: Callable[..., Service],
                                                      tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as c:
        for fmt in ("parquet", "xml"):  # any name the backend may write reaches it; it refuses what its type lacks
            refused = assert_envelope_error(c.post("/api/v1/exports", json={"export_type": "plain_tickets",
                                                                            "format": fmt}), 422, 42200)
            assert refused["data"] == {"field": "format", "reason": "export type plain_tickets offers csv, jsonl"}
        bad = assert_envelope_error(c.post("/api/v1/exports", json={"export_type": "plain_tickets",
                                                                    "format": "../x"}), 422, 42200)
        assert bad["data"]["field"] == "format"
        accepted = c.post("/api/v1/exports", json={"export_type": "safe_tickets"})
        assert accepted.status_code == 202, accepted.text
    assert "format" not in yaml.safe_dump(gateway.config["routes"])  # the shipped routes list no formats


def test_the_old_flat_shape_still_loads_with_one_warning(services: Callable[..., Service], tmp_path: Path) -> None:
    flat = {"old_orders": {"dataset": "orders", "rows": 300, "seed": 2},
            "old_report": {"dataset": "report", "rows": 50, "formats": ["jsonl"]}}
    config = backend_config(tmp_path, export_types=flat)
    backend = services("backend_stub", config)
    warnings = [line for line in backend.log().splitlines() if "old flat shape" in line]
    assert len(warnings) == 1 and "old_orders, old_report" in warnings[0] and "source: {kind: synthetic" in warnings[0]
    assert json.loads(warnings[0])["level"] == "warning"
    done, file = export(backend, "old_orders")
    assert done["result"]["rows"] == 300
    expected = io.StringIO()
    csv.writer(expected).writerows([DATASETS["orders"].columns, *DATASETS["orders"].generate(2, 300)])
    assert file.content == expected.getvalue().encode()
