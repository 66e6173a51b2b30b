"""Event streams where the upstream does not help: a backend without a change feed (the gateway's shared
pollers: watchers of one task cost the backend one poll per interval, not one each), and a backend that dies
(streams end cleanly, new ones are refused at once, the SDK falls back to polling)."""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from exports_client import ExportsClient, WaitTimeout
from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.procs import Service
from tests.sse_client import RawStream
from tests.test_events import AUTH, TYPES, Requests, _events_settings, _route, events_path, submit

POLL_SEC = 0.5


def _gateway(services: Callable[..., Service], tmp: Path, backend: Service, name: str) -> Service:
    config = gateway_config(tmp, backend.url)
    for route in ("task_events", "events"):
        _events_settings(_route(config, route)).update(poll_interval_sec=POLL_SEC, upstream_down_close_sec=2,
                                                       open_wait_sec=1, retry_ms=500)
    return services("gateway", config, name=name)


def _metric(gateway: Service, pattern: str) -> float:
    found = re.search(pattern + r" ([0-9.e+]+)", httpx.get(f"{gateway.url}/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_without_a_feed_one_shared_poller_serves_every_watcher_of_a_task(
        services: Callable[..., Service], tmp_path: Path) -> None:
    config = backend_config(tmp_path, change_log={"feed": False})
    config["export_types"].update(TYPES)
    backend = services("backend_stub", config)
    gateway = _gateway(services, tmp_path, backend, "gateway")
    task = submit(gateway, "blocker_export")
    started = time.monotonic()
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as one, \
            RawStream(gateway.url, events_path(task["task_id"]), AUTH) as two, \
            RawStream(gateway.url, "/api/v1/events", AUTH) as tenant:
        one.read_to_end()
        two.read_to_end()
        tenant.read_until(lambda s: s.terminal())
    elapsed = time.monotonic() - started
    for stream in (one, two):
        assert stream.ended and stream.events[-1].task["status"] == "COMPLETED"
        assert "id" in stream.events[-1].fields, "the backend's change ids still name the events"
    assert tenant.events[-1].task["task_id"] == task["task_id"]
    polls = _metric(gateway, r'gateway_event_polls_total\{upstream="exports"\}')
    reads = _metric(gateway, r'gateway_upstream_calls_total\{outcome="200",route="task_events",upstream="exports"\}')
    # one poller for the task however many watch it: about one read per interval, plus each stream's opening
    assert 1 <= reads <= elapsed / POLL_SEC + 4, (reads, elapsed)
    assert polls <= 2 * (elapsed / POLL_SEC) + 4, (polls, elapsed)  # the task's poller and the tenant's


def test_a_dead_backend_ends_streams_cleanly_and_the_sdk_falls_back_to_polling(
        services: Callable[..., Service], tmp_path: Path) -> None:
    config = backend_config(tmp_path)
    config["export_types"]["slow_export"]["fault"]["delay_sec"] = 20
    backend = services("backend_stub", config)
    gateway = _gateway(services, tmp_path, backend, "gateway")
    task = submit(gateway, "slow_export")
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as stream:
        stream.read_until(lambda s: bool(s.events))
        backend.kill()
        stream.read_to_end(timeout=20)
    assert stream.ended and not stream.cut, "the stream ends with its last chunk, not a cut"
    started = time.monotonic()
    refused = httpx.get(f"{gateway.url}{events_path(task['task_id'])}", headers=AUTH, timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
    assert time.monotonic() - started < 5, "refused at once, not left hanging"
    requests = Requests()
    with ExportsClient(gateway.url, DEMO_KEY, transport=requests, retries=1) as client:
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timeout:
            client.wait(task["task_id"], max_wait=4)
    assert time.monotonic() - started < 12
    assert timeout.value.task is not None and timeout.value.task.status == "RUNNING", "the last state seen"
    assert f"GET /api/v1/exports/{task['task_id']}" in requests.paths, "fell back to polling the status route"
