"""Small HTTP helpers shared by the tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Collection

import httpx

from exports_common.contract import TERMINAL
from exports_common.task_ids import new_task_id
from tests.procs import backend_headers, wait_until


def backend_create(url: str, body: dict[str, Any], tenant: str = "t1", task_id: str | None = None) -> httpx.Response:
    return httpx.post(f"{url}/exports", json=body, timeout=10,
                      headers=backend_headers(tenant, **{"X-Task-Id": task_id or new_task_id()}))


def backend_task(url: str, task_id: str, tenant: str = "t1") -> dict[str, Any]:
    """A task as its backend reads it (as the gateway asks: with the service token and the tenant)."""
    resp = httpx.get(f"{url}/exports/{task_id}", headers=backend_headers(tenant), timeout=10)
    resp.raise_for_status()
    return resp.json()["data"]


def wait_status(url: str, task_id: str, statuses: Collection[str] = TERMINAL, timeout: float = 20.0,
                path: str = "/exports/", headers: dict[str, str] | None = None, tenant: str = "t1") -> dict[str, Any]:
    """Poll a task until it reaches one of `statuses`: on a backend (the default path) as `tenant`'s, with the
    service token, unless `headers` name the tenant; on a gateway (its API path) with `headers` alone."""
    if path == "/exports/":
        headers = backend_headers(tenant) | (headers or {})

    def check() -> dict[str, Any] | None:
        resp = httpx.get(f"{url}{path}{task_id}", headers=headers or {}, timeout=10)
        data = resp.json()["data"] if resp.status_code == 200 else None
        return data if data and data["status"] in statuses else None

    return wait_until(check, timeout, interval=0.1, what=f"task {task_id} to reach {sorted(statuses)}")


def assert_envelope_error(resp: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def upstream_calls(gateway_url: str, route: str) -> int:
    """Calls the gateway made upstream for `route`, from its own metrics."""
    text = httpx.get(f"{gateway_url}/metrics").text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gateway_upstream_calls_total{") and f'route="{route}"' in line))


def backend_requests(backend_url: str) -> int:
    """API requests the backend has served, from its own count."""
    return int(httpx.get(f"{backend_url}/healthz").json()["data"]["requests"])


def install_distribution(site: Path, package: str, entry_points: dict[str, str], source: str) -> None:
    """A one-module package as pip leaves it (a `.dist-info` beside the module), plugins in its entry points."""
    from gateway.plugin_registry import GROUP

    module = package.replace("-", "_")
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
