"""`python -m gateway conformance`: our backend passes it; backends that break the contract fail the right check.

Also: the backend's routes are the ones the published upstream contract (an OpenAPI document)
lists, and the ones that need X-Tenant-Id answer 400 without it.
"""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.routing import Route

from backend_stub.app import create_app
from backend_stub.config import BackendConfig
from exports_common.config_loader import load_model
from tests.conftest import backend_config
from tests.procs import ROOT, SERVICE_TOKEN, Service, backend_headers, free_port, stand_in, uvicorn_command

CONTRACT = ROOT / "docs" / "backend-teams" / "upstream-openapi.yaml"
TASK_ID = "exp-20261201-aaaaaaaaaaaaaaaaaaaa"


def conformance(upstream: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "conformance", "--upstream", upstream,
                           "--export-type", "report_export", "--token", SERVICE_TOKEN], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def backend(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Service:
    return module_services("backend_stub", backend_config(tmp_path_factory.mktemp("conformance")))


@pytest.fixture
def broken(backend: Service, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    port = free_port()
    env = {"BREAK": request.param, "UPSTREAM": backend.url, "PATH": "/usr/bin:/bin"}
    with stand_in(uvicorn_command("tests.broken_backend:app", port), port, "the broken backend", env=env,
                  log=tmp_path / "broken.log") as url:
        yield url


def lines(out: str, verdict: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(verdict)]


def test_our_backend_passes_every_check_and_leaves_no_task_running(backend: Service) -> None:
    run = conformance(backend.url)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not lines(run.stdout, "FAIL") and len(lines(run.stdout, "PASS")) == 12, run.stdout
    assert "PASS     change feed" in run.stdout
    listed = httpx.get(f"{backend.url}/exports", headers=backend_headers("conformance"), timeout=10).json()
    statuses = {t["task_id"]: t["status"] for t in listed["data"]["items"]}
    assert statuses and all(t.startswith("conformance-") for t in statuses)
    assert not {"PENDING", "RUNNING"} & set(statuses.values()), statuses


@pytest.mark.parametrize(("broken", "failed"), [
    ("tenant", {"400 without X-Tenant-Id", "tenant isolation by X-Tenant-Id"}),
    ("task_id", {"create with the gateway's task id"}),
    ("range", {"file download with Range"}),
], indirect=["broken"])
def test_a_backend_that_breaks_the_contract_fails_the_check_that_names_it(broken: str, failed: set[str]) -> None:
    run = conformance(broken)
    assert run.returncode == 1, run.stdout + run.stderr
    named = {line[9:].split(":", 1)[0] for line in lines(run.stdout, "FAIL")}
    assert failed <= named, run.stdout


def _contract() -> dict[str, Any]:
    return dict(yaml.safe_load(CONTRACT.read_text()))


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in _contract()["paths"].items():
        for method, operation in operations.items():
            yield path, method.upper(), operation


@pytest.mark.inprocess
def test_the_backends_routes_are_the_ones_the_published_contract_lists(tmp_path: Path) -> None:
    path = tmp_path / "backend.yaml"
    path.write_text(yaml.safe_dump(backend_config(tmp_path)))
    app: Any = create_app(load_model(path, BackendConfig))
    while not isinstance(app, Starlette):  # inside the backend's own middleware
        app = app.app
    served = {(route.path, method) for route in app.routes if isinstance(route, Route)
              for method in route.methods or () if method != "HEAD" or route.path.endswith("/file")}
    listed = {(path, method) for path, method, _ in _operations()}
    assert served == listed, (sorted(served - listed), sorted(listed - served))


def test_what_needs_x_tenant_id_answers_400_without_it_and_what_takes_none_does_not(backend: Service) -> None:
    for path, method, operation in _operations():
        url = backend.url + path.replace("{task_id}", TASK_ID) + ("?follow=false" if path == "/events" else "")
        headers = backend_headers(**{"X-Task-Id": TASK_ID}) if (path, method) == ("/exports", "POST") else \
            backend_headers()
        status = httpx.request(method, url, headers=headers, json={"export_type": "report_export"}
                               if method == "POST" else None, timeout=10).status_code
        if operation["x-tenant"] == "required":
            assert status == 400, (method, path, status)
        else:
            assert status != 400, (method, path, status)
