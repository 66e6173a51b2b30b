"""`source: {kind: python}`: an installed package's source (examples/jsonl_events) run by a real backend, held to
interface v1: the declared filters applied, the tenant's rows only, failures named without their text."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from backend_stub.config import BackendConfig
from exports_common.config_loader import ConfigError, load_model
from tests.conftest import backend_config
from tests.helpers import backend_create, wait_status
from tests.procs import Service, backend_headers

EVENTS = 3000


def events_type(path: Path, **fields: Any) -> dict[str, Any]:
    return {"source": {"kind": "python", "entry_point": "jsonl_events", "options": {"path": str(path)}},
            "formats": ["csv", "jsonl"],
            "filters": {"kind": {"type": "enum", "column": "kind", "values": ["login", "export", "delete"],
                                 "multiple": True},
                        "day_from": {"type": "date", "column": "day", "op": "gte"}}, **fields}


def write_events(path: Path) -> list[dict[str, Any]]:
    events = [{"id": f"e{i}", "tenant": ("acme", "globex")[i % 2], "at": f"2026-11-{1 + i % 28:02d}T08:30:00Z",
               "kind": ("login", "export", "delete")[i % 3], "detail": {"n": i}} for i in range(EVENTS)]
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return events


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Service, list[dict[str, Any]]]:
    workdir = tmp_path_factory.mktemp("python-source")
    events = write_events(workdir / "events.jsonl")
    (workdir / "broken.jsonl").write_text('{"id": "x", "tenant": "acme", "at": "2026-11-01", "kind": "login"}\n'
                                          '{"password": "hunter2"}\n')
    types = {"events": events_type(workdir / "events.jsonl"), "broken_events": events_type(workdir / "broken.jsonl")}
    return module_services("backend_stub", backend_config(workdir, export_types=types), name="backend"), events


def exported(backend: Service, tenant: str, **body: Any) -> tuple[dict[str, Any], bytes]:
    created = backend_create(backend.url, {"export_type": "events", **body}, tenant=tenant)
    assert created.status_code == 201, created.text
    done = wait_status(backend.url, created.json()["data"]["task_id"], timeout=30, tenant=tenant)
    assert done["status"] == "COMPLETED", done
    file = httpx.get(f"{backend.url}{done['result']['download_url']}", headers=backend_headers(), timeout=10)
    return done, file.content


def test_a_python_source_exports_only_the_tenants_rows_with_the_declared_filters_applied(
        stack: tuple[Service, list[dict[str, Any]]]) -> None:
    backend, events = stack
    done, body = exported(backend, "acme", filters={"kind": ["login", "delete"], "day_from": "2026-11-15"})
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0] == ["event_id", "day", "at", "kind", "detail"]
    expected = [e["id"] for e in events if e["tenant"] == "acme" and e["kind"] in ("login", "delete")
                and e["at"][:10] >= "2026-11-15"]
    assert [row[0] for row in rows[1:]] == expected and done["result"]["rows"] == len(expected) > 0
    _, body = exported(backend, "globex", format="jsonl")
    lines = [json.loads(line) for line in body.splitlines()]
    assert [line["event_id"] for line in lines] == [e["id"] for e in events if e["tenant"] == "globex"]
    assert lines[0] == {"event_id": "e1", "day": "2026-11-02", "at": "2026-11-02T08:30:00Z", "kind": "export",
                        "detail": '{"n": 1}'}


def test_a_failing_source_fails_the_task_as_source_error_without_its_message(
        stack: tuple[Service, list[dict[str, Any]]]) -> None:
    backend, _ = stack
    created = backend_create(backend.url, {"export_type": "broken_events"}, tenant="acme")
    done = wait_status(backend.url, created.json()["data"]["task_id"], timeout=30, tenant="acme")
    assert done["status"] == "FAILED" and done["error"]["code"] == "SOURCE_ERROR", done
    assert "jsonl_events" in done["error"]["message"] and "hunter2" not in json.dumps(done)
    assert "hunter2" not in backend.log()


@pytest.mark.inprocess
@pytest.mark.parametrize("source,problem", [
    ({"kind": "python", "entry_point": "no_such_source"}, "no installed package offers the source 'no_such_source'"),
    ({"kind": "python", "entry_point": "jsonl_events", "options": {"path": "/dev/null"}}, "no column 'region'"),
])
def test_a_config_with_a_source_it_cannot_use_is_refused_naming_the_type(tmp_path: Path, source: dict[str, Any],
                                                                     problem: str) -> None:
    config = backend_config(tmp_path, export_types={"events": {
        "source": source, "filters": {"region": {"type": "string", "column": "region"}}}})
    (tmp_path / "backend.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as refused:
        load_model(tmp_path / "backend.yaml", BackendConfig)
    assert any(p.startswith("export_types.events") and problem in p for p in refused.value.problems), \
        refused.value.problems
