"""The export backend end to end over HTTP, against the SQLite store and the Redis store alike."""
from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from backend_stub.datasets import DATASETS
from exports_common.task_ids import new_task_id
from tests.conftest import backend_config
from tests.helpers import (
    assert_envelope_error,
    backend_create,
    backend_task,
    wait_status,
)
from tests.procs import RedisServer, Service, backend_headers, load_default, wait_until

T1 = backend_headers("t1")


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, module_services: Callable[..., Service],
            tmp_path_factory: pytest.TempPathFactory) -> Service:
    redis_url = ""
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        redis_url = redis.url
    workdir = tmp_path_factory.mktemp(f"backend-{request.param}")
    return module_services("backend_stub", backend_config(workdir, redis_url, redis_prefix=f"lc{time.time_ns()}"),
                           name=f"backend-{request.param}")


def files_dir(backend: Service) -> Path:
    return Path(backend.config["data_dir"]) / "files"


def expected_orders(spec: dict[str, Any], keep: Callable[[tuple], bool]) -> list[list[str]]:
    rows = DATASETS["orders"].generate(spec["source"]["seed"], spec["source"]["rows"])
    return [[str(v) for v in row] for row in rows if keep(row)]


def test_create_poll_download_matches_filters(backend: Service) -> None:
    filters = {"status": ["paid", "shipped"], "region": "eu-west", "date_from": "2025-06-01", "min_amount": 100}
    resp = backend_create(backend.url, {"export_type": "order_export", "filters": filters})
    assert resp.status_code == 201
    task = resp.json()["data"]
    assert task["status"] == "PENDING" and task["attempt"] == 1 and task["estimated_completion_sec"] >= 1

    done = wait_status(backend.url, task["task_id"])
    assert done["status"] == "COMPLETED" and done["progress"] == 100 and done["current_step"] is None
    result = done["result"]
    assert result["format"] == "csv" and result["download_url"] == f"/exports/{task['task_id']}/file"

    body = httpx.get(f"{backend.url}{result['download_url']}", headers=backend_headers(), timeout=30).text
    rows = list(csv.reader(io.StringIO(body)))
    assert rows[0] == list(DATASETS["orders"].columns)
    spec = load_default("backend.yaml")["export_types"]["order_export"]
    expected = expected_orders(spec, lambda r: r[2] in ("paid", "shipped") and r[3] == "eu-west"
                               and r[5] >= "2025-06-01" and r[4] >= 100)
    assert rows[1:] == expected
    assert result["rows"] == len(expected) > 0
    assert result["bytes"] == len(body.encode())


def test_jsonl_format_and_range(backend: Service) -> None:
    task_id = backend_create(backend.url, {"export_type": "report_export", "format": "jsonl",
                                           "filters": {"metric": "revenue"}}).json()["data"]["task_id"]
    done = wait_status(backend.url, task_id)
    url = f"{backend.url}/exports/{task_id}/file"
    lines = httpx.get(url, headers=backend_headers(), timeout=30).text.splitlines()
    assert len(lines) == done["result"]["rows"] and all(json.loads(line)["metric"] == "revenue" for line in lines)
    part = httpx.get(url, headers=backend_headers(Range="bytes=0-9"), timeout=10)
    assert part.status_code == 206 and len(part.content) == 10


def test_create_is_idempotent_by_task_id(backend: Service) -> None:
    task_id = new_task_id()
    body = {"export_type": "user_export", "filters": {"plan": "pro"}}
    first = backend_create(backend.url, body, task_id=task_id)
    again = backend_create(backend.url, body, task_id=task_id)
    other = backend_create(backend.url, dict(body, filters={"plan": "team"}), task_id=task_id)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["data"]["created_at"] == first.json()["data"]["created_at"]
    assert_envelope_error(other, 409, 40901)


def test_progress_and_steps_while_running_then_cancel_removes_partial_file(backend: Service) -> None:
    task_id = backend_create(backend.url, {"export_type": "slow_export"}).json()["data"]["task_id"]
    running = wait_status(backend.url, task_id, {"RUNNING"})
    seen = [running["progress"]]
    wait_until(lambda: backend_task(backend.url, task_id)["progress"] > 5, 10, what="progress")
    seen.append(backend_task(backend.url, task_id)["progress"])
    assert seen == sorted(seen) and backend_task(backend.url, task_id)["current_step"] == "render"
    assert any(p.name.startswith(task_id) and p.suffix == ".part" for p in files_dir(backend).iterdir()), (
        list(files_dir(backend).iterdir()))

    resp = httpx.post(f"{backend.url}/exports/{task_id}/cancel", headers=T1, timeout=10)
    assert resp.status_code == 200 and resp.json()["data"]["status"] == "CANCELLED"
    wait_until(lambda: not any(p.name.startswith(task_id) for p in files_dir(backend).iterdir()), 10,
               what="the partial file to be removed")
    again = httpx.post(f"{backend.url}/exports/{task_id}/cancel", headers=T1, timeout=10)
    assert again.status_code == 200 and again.json()["data"]["status"] == "CANCELLED"


def test_cancel_pending_and_cancel_finished(backend: Service) -> None:
    done_id = backend_create(backend.url, {"export_type": "report_export"}).json()["data"]["task_id"]
    wait_status(backend.url, done_id)
    body = assert_envelope_error(httpx.post(f"{backend.url}/exports/{done_id}/cancel", headers=T1), 409, 40904)
    assert body["data"]["status"] == "COMPLETED"


def test_timeout_frees_worker_and_removes_partial_file(backend: Service) -> None:
    started = time.monotonic()
    task_id = backend_create(backend.url, {"export_type": "slow_export", "timeout_sec": 1}).json()["data"]["task_id"]
    done = wait_status(backend.url, task_id, timeout=10)
    assert done["status"] == "TIMEOUT"
    assert done["error"]["code"] == "TASK_TIMEOUT" and done["error"]["retryable"] is True
    assert time.monotonic() - started < 4
    wait_until(lambda: not any(p.name.startswith(task_id) for p in files_dir(backend).iterdir()), 10,
               what="the partial file to be removed")


def test_transient_failure_is_retried_then_succeeds(backend: Service) -> None:
    task_id = backend_create(backend.url, {"export_type": "flaky_export"}).json()["data"]["task_id"]
    done = wait_status(backend.url, task_id)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2 and done["error"] is None


def test_max_attempts_then_failed_not_retryable(backend: Service) -> None:
    task_id = backend_create(backend.url, {"export_type": "broken_export"}).json()["data"]["task_id"]
    done = wait_status(backend.url, task_id)
    assert done["status"] == "FAILED" and done["attempt"] == 2
    assert done["error"]["code"] == "EXPORT_FAILED" and done["error"]["retryable"] is False
    resp = httpx.post(f"{backend.url}/exports/{task_id}/retry", json={"expected_attempt": 2}, headers=T1, timeout=10)
    assert_envelope_error(resp, 409, 40905)


def test_rerun_of_timeout_and_stale_attempt(backend: Service) -> None:
    task_id = backend_create(backend.url, {"export_type": "slow_export", "timeout_sec": 1}).json()["data"]["task_id"]
    wait_status(backend.url, task_id, {"TIMEOUT"}, timeout=10)
    url = f"{backend.url}/exports/{task_id}/retry"
    resp = httpx.post(url, json={"expected_attempt": 1, "overrides": {"timeout_sec": 2, "degraded": True}}, headers=T1)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["attempt"] == 2 and data["status"] == "PENDING" and data["degraded"] is True
    assert data["timeout_sec"] == 2
    stale = httpx.post(url, json={"expected_attempt": 1, "overrides": {"timeout_sec": 2}}, headers=T1)
    assert_envelope_error(stale, 409, 40903)
    done = wait_status(backend.url, task_id, timeout=10)
    assert done["status"] == "TIMEOUT" and done["attempt"] == 2 and done["degraded"] is True
    bad = httpx.post(url, json={"expected_attempt": 2, "overrides": {"rows": 5}}, headers=T1)
    assert_envelope_error(bad, 422, 42200)


def test_list_is_per_tenant_newest_first_with_cursor(backend: Service) -> None:
    tenant = f"lister{time.time_ns()}"
    ids = [backend_create(backend.url, {"export_type": "report_export"}, tenant=tenant).json()["data"]["task_id"]
           for _ in range(5)]
    backend_create(backend.url, {"export_type": "report_export"}, tenant="someone-else")
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = httpx.get(f"{backend.url}/exports", params=params, headers=backend_headers(tenant)).json()["data"]
        seen += [t["task_id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    for task_id in ids:
        wait_status(backend.url, task_id, tenant=tenant)
    done = httpx.get(f"{backend.url}/exports", params={"status": "COMPLETED"},
                     headers=backend_headers(tenant)).json()["data"]
    assert len(done["items"]) == 5
    assert httpx.get(f"{backend.url}/exports/{ids[0]}", headers=backend_headers("someone-else")).status_code == 404


@pytest.mark.parametrize("body,headers,status,code,field", [
    ({"export_type": "nope"}, {}, 422, 42200, "export_type"),
    ({"export_type": "order_export", "filters": {"colour": "red"}}, {}, 422, 42200, "filters.colour"),
    ({"export_type": "order_export", "filters": {"date_from": "2025-13-01"}}, {}, 422, 42200, "filters.date_from"),
    ({"export_type": "order_export", "filters": {"status": ["paid", "lost"]}}, {}, 422, 42200, "filters.status"),
    ({"export_type": "order_export", "filters": {"min_amount": "ten"}}, {}, 422, 42200, "filters.min_amount"),
    ({"export_type": "order_export", "filters": []}, {}, 422, 42200, "filters"),
    ({"export_type": "order_export", "timeout_sec": 0}, {}, 422, 42200, "timeout_sec"),
    ({"export_type": "order_export", "timeout_sec": 3601}, {}, 422, 42200, "timeout_sec"),
    ({"export_type": "order_export", "timeout_sec": True}, {}, 422, 42200, "timeout_sec"),
    ({"export_type": "order_export", "format": "xlsx"}, {}, 422, 42200, "format"),
    ({"export_type": "order_export", "callback_url": "ftp://x/y"}, {}, 422, 42200, "callback_url"),
    ({"export_type": "order_export", "extra": 1}, {}, 422, 42200, "extra"),
    ({"export_type": "order_export"}, {"X-Task-Id": "not-an-id"}, 422, 42200, "X-Task-Id"),
    ({"export_type": "order_export"}, {"X-Tenant-Id": ""}, 422, 42200, "X-Tenant-Id"),
])
def test_bad_create_input(backend: Service, body: dict[str, Any], headers: dict[str, str], status: int, code: int,
                          field: str) -> None:
    all_headers = backend_headers("t1", **{"X-Task-Id": new_task_id()}) | headers
    resp = httpx.post(f"{backend.url}/exports", json=body, headers=all_headers)
    assert assert_envelope_error(resp, status, code)["data"]["field"] == field
    listed = httpx.get(f"{backend.url}/exports", params={"limit": 500}, headers=T1).json()["data"]["items"]
    assert all_headers["X-Task-Id"] not in {t["task_id"] for t in listed}


def test_bad_transport_input(backend: Service) -> None:
    headers = backend_headers("t1", **{"X-Task-Id": new_task_id()})
    url = f"{backend.url}/exports"
    assert_envelope_error(httpx.post(url, content=b"{nope", headers=headers | {"Content-Type": "application/json"}),
                          400, 40001)
    assert_envelope_error(httpx.post(url, content=b"a=b", headers=headers | {"Content-Type": "text/plain"}), 415, 41500)
    big = json.dumps({"export_type": "order_export", "filters": {"x": "y" * 70000}})
    assert_envelope_error(httpx.post(url, content=big, headers=headers | {"Content-Type": "application/json"}),
                          413, 41300)
    assert_envelope_error(httpx.get(f"{backend.url}/exports/{new_task_id()}", headers=T1), 404, 40401)
    assert_envelope_error(httpx.get(f"{backend.url}/exports/EXP-not-an-id", headers=T1), 404, 40401)
    assert_envelope_error(httpx.delete(url, headers=T1), 405, 40500)
    assert_envelope_error(httpx.get(url, params={"limit": 0}, headers=T1), 422, 42200)
    assert_envelope_error(httpx.get(url, params={"cursor": "garbage!"}, headers=T1), 422, 42200)
    assert_envelope_error(httpx.get(url, params={"status": "DONE"}, headers=T1), 422, 42200)


def test_expired_tasks_and_files_are_deleted(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, task_ttl_sec=1, sweep_interval_sec=0.2))
    task_id = backend_create(backend.url, {"export_type": "report_export"}).json()["data"]["task_id"]
    wait_status(backend.url, task_id)
    assert any(p.name.startswith(task_id) for p in files_dir(backend).iterdir())
    wait_until(lambda: httpx.get(f"{backend.url}/exports/{task_id}", headers=T1).status_code == 404, 10,
               what="expiry")
    wait_until(lambda: not any(p.name.startswith(task_id) for p in files_dir(backend).iterdir()), 10,
               what="the file to be deleted")
