"""Several gateway processes sharing Redis: idempotency keys and the status cache hold across them."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import httpx

from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.helpers import wait_status
from tests.procs import RedisServer, Service

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}


def test_two_gateways_share_idempotency_and_cache(services: Callable[..., Service], tmp_path: Path,
                                                  redis_server: RedisServer) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_server.url, redis_prefix="shared"))
    first = services("gateway", gateway_config(tmp_path, backend.url, redis_server.url, redis_prefix="gw1"),
                     name="gateway-1")
    second = services("gateway", gateway_config(tmp_path, backend.url, redis_server.url, redis_prefix="gw1"),
                      name="gateway-2")
    key = {"Idempotency-Key": f"shared-{time.time_ns()}"}
    body = {"export_type": "report_export"}
    created = httpx.post(f"{first.url}{API}", json=body, headers=AUTH | key)
    replayed = httpx.post(f"{second.url}{API}", json=body, headers=AUTH | key)
    assert created.status_code == replayed.status_code == 202
    assert replayed.json()["data"]["task_id"] == created.json()["data"]["task_id"]
    assert replayed.headers["idempotent-replayed"] == "true"
    mismatch = httpx.post(f"{second.url}{API}", json={"export_type": "user_export"}, headers=AUTH | key)
    assert mismatch.status_code == 422

    task_id = created.json()["data"]["task_id"]
    wait_status(backend.url, task_id, headers={"X-Tenant-Id": "demo"})
    miss = httpx.get(f"{first.url}{API}/{task_id}", headers=AUTH)
    hit = httpx.get(f"{second.url}{API}/{task_id}", headers=AUTH)
    assert miss.headers["x-cache"] == "MISS" and hit.headers["x-cache"] == "HIT"
    assert hit.json() == miss.json()
