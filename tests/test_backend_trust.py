"""The backend trusts only the gateway: a service token on every request but the probes, and a named tenant."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from exports_common.task_ids import new_task_id
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config
from tests.helpers import assert_envelope_error, backend_create
from tests.procs import ROOT, SERVICE_TOKEN, Service, backend_headers, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_caller_without_the_service_token_gets_401_but_the_probes_answer(stack: tuple[Service, Service]) -> None:
    backend, _ = stack
    task_id = backend_create(backend.url, {"export_type": "report_export"}, tenant="demo").json()["data"]["task_id"]
    for path in (f"/exports/{task_id}", "/exports", "/export-types", "/metrics", "/events?follow=false",
                 "/internal/tasks?tenant=demo", f"/exports/{task_id}/file"):
        for headers in ({"X-Tenant-Id": "demo"}, {"X-Tenant-Id": "demo", "Authorization": "Bearer wrong"},
                        {"X-Tenant-Id": "demo", "Authorization": SERVICE_TOKEN}):
            assert_envelope_error(httpx.get(f"{backend.url}{path}", headers=headers, timeout=10), 401, 40100)
    refused = httpx.post(f"{backend.url}/exports", json={"export_type": "report_export"}, timeout=10,
                         headers={"X-Tenant-Id": "demo", "X-Task-Id": new_task_id()})
    assert_envelope_error(refused, 401, 40100)
    assert httpx.get(f"{backend.url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{backend.url}/readyz", timeout=10).status_code == 200


def test_without_a_tenant_the_task_endpoints_are_400_but_a_file_download_is_not(
        stack: tuple[Service, Service]) -> None:
    backend, _ = stack
    task_id = backend_create(backend.url, {"export_type": "report_export"}, tenant="demo").json()["data"]["task_id"]
    token_only = backend_headers()
    for method, path in (("GET", f"/exports/{task_id}"), ("GET", "/exports?tenant=demo"), ("POST", "/exports"),
                         ("POST", f"/exports/{task_id}/cancel"), ("POST", f"/exports/{task_id}/retry")):
        resp = httpx.request(method, f"{backend.url}{path}", headers=token_only | {"X-Task-Id": new_task_id()},
                             json={"export_type": "report_export"}, timeout=10)
        body = assert_envelope_error(resp, 400, 40000)
        assert "X-Tenant-Id" in body["message"], body
    assert httpx.get(f"{backend.url}/exports/{task_id}", headers=backend_headers("demo2"),
                     timeout=10).status_code == 404, "another tenant's task is not there"
    wait_until(lambda: httpx.get(f"{backend.url}/exports/{task_id}/file", headers=token_only,
                                 timeout=10).status_code == 200, 20, what="the file, by a signed link's call")
    for path in ("/export-types", "/metrics", "/internal/tasks?tenant=demo"):
        assert httpx.get(f"{backend.url}{path}", headers=token_only, timeout=10).status_code == 200, path


def test_the_gateway_sends_the_token_on_every_call_it_makes(stack: tuple[Service, Service]) -> None:
    _, gateway = stack
    with httpx.Client(base_url=gateway.url, headers=AUTH, timeout=10) as client:
        # a client's own Authorization never reaches the backend: only the gateway's token does
        task_id = client.post(API, json={"export_type": "report_export"}).json()["data"]["task_id"]
        with client.stream("GET", f"{API}/{task_id}/events") as events:  # follows the backend's change feed
            assert events.status_code == 200
            feeds = wait_until(lambda: (f := client.get("/admin/stats", headers=ADMIN).json()["data"]
                                        ["event_streams"]["feeds"]) and f.get("exports") not in (None, "idle")
                               and f, 15, what="the hub to follow the feed")
            assert feeds["exports"] == "feed", feeds
        assert client.get(f"{API}/{task_id}").status_code == 200
        listed = client.get("/admin/recovery/tasks", params={"tenant": "demo"}, headers=ADMIN)
        assert listed.status_code == 200, listed.text
        document = client.get("/openapi.json").text
        assert "order_export" in document, "the export types were read from the backend"
    log = gateway.log()
    assert "the change feed failed" not in log and "export types unavailable" not in log


def test_outside_dev_mode_a_backend_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    config = backend_config(tmp_path)
    path = tmp_path / "backend.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"PATH": "/usr/bin:/bin", "BACKEND_SERVICE_TOKEN": ""}
    run = subprocess.run([sys.executable, "-m", "backend_stub", "run", "--config", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "service_token is empty" in run.stderr and "BACKEND_SERVICE_TOKEN" in run.stderr
    short = subprocess.run([sys.executable, "-m", "backend_stub", "run", "--config", str(path)], cwd=ROOT,
                           env=env | {"BACKEND_SERVICE_TOKEN": "short"}, capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "service_token is too short" in short.stderr
