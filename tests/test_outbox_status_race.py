"""A status read that races the outbox's delivery of its task never answers 404 (issue 24, the `db_kill` chaos loss).

The order the chaos run hit by chance, made exact by a proxy between the gateway and a real backend: the
submit is outboxed (the backend's creates answer 503, as with its store down); a status read reaches the
backend, which answers 404 (not delivered yet), and that answer is held; the drainer then delivers the
submission and takes it out of the outbox; only then does the gateway see the 404 and look in the outbox.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.procs import RedisServer, Service, backend_headers, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def steer(proxy: Service, what: str, on: bool) -> None:
    httpx.post(f"{proxy.url}/_steer/{what}", json={"on": on}).raise_for_status()


def outbox_pending(gateway: Service) -> int:
    return int(httpx.get(f"{gateway.url}/admin/stats", headers=ADMIN).json()["data"]["outbox"]["pending"])


def patient(config: dict[str, Any]) -> dict[str, Any]:
    """Status reads wait out the held answer (the test holds it for seconds) instead of timing out, and reach the
    backend however many creates the proxy refused (no breaker opens on them)."""
    config["upstreams"]["exports"]["circuit_breaker"] = {"fail_max": 10_000, "reset_timeout_sec": 1}
    for route in config["routes"]:
        if route["name"] == "status":
            route["policy"]["timeout"] = {"connect": 2, "read": 60, "total": 60}
    return config


@pytest.mark.parametrize("outbox", ["sqlite", "redis"])
def test_status_read_racing_the_delivery_finds_the_task(services: Callable[..., Service], tmp_path: Path,
                                                        redis_server: RedisServer, outbox: str) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    proxy = services("tests.held_upstream", {"upstream": backend.url}, name="held-upstream")
    # the gateway's outbox in its state file, or in Redis (a prefix of its own: nobody else's outbox)
    on_redis = outbox == "redis"
    gateway = services("gateway", patient(gateway_config(tmp_path, proxy.url, redis_server.url if on_redis else "",
                                                         redis_prefix=f"race{time.time_ns()}")))

    steer(proxy, "refuse_creates", True)
    submitted = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=30)
    assert submitted.status_code == 202 and submitted.json()["data"]["degraded"] is True, submitted.text
    task_id = submitted.json()["data"]["task_id"]
    assert outbox_pending(gateway) == 1

    steer(proxy, "hold_reads", True)
    answers: list[httpx.Response] = []
    reader = threading.Thread(target=lambda: answers.append(
        httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH, timeout=60)))
    reader.start()
    wait_until(lambda: httpx.get(f"{proxy.url}/_steer/held").json()["waiting"] == 1, 15,
               what="the backend's 404 to the status read to be held")

    steer(proxy, "refuse_creates", False)
    wait_until(lambda: outbox_pending(gateway) == 0, 30, what="the drainer to deliver the submission")
    created = httpx.get(f"{backend.url}/exports/{task_id}", headers=backend_headers("demo"))
    assert created.status_code == 200, "delivered: the backend has the task"

    steer(proxy, "hold_reads", False)
    reader.join(60)
    assert len(answers) == 1
    read = answers[0]
    assert read.status_code == 200, f"an accepted task answered {read.status_code}: {read.text}"
    assert read.json()["data"]["task_id"] == task_id
