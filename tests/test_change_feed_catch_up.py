"""A tenant's catch-up on the backend's change feed reads a bounded part of the log, however old its id.

A client's tenant stream resumed with Last-Event-ID makes its gateway read the feed from that id
with `tenant` and `follow=false`. Every tenant's entries are in the one log, so an old id would
cost a read of all of them since; past `change_log.catch_up_max_entries` the feed answers a gap
instead (the gateway then starts the stream from the tenant's current tasks).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import backend_config
from tests.helpers import backend_create, wait_status
from tests.procs import Service, backend_headers

MAX_ENTRIES = 100


def _feed(backend: Service, query: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{backend.url}/events?{query}", headers=backend_headers(), timeout=30)
    assert resp.status_code == 200, resp.text
    return [json.loads(line) for line in resp.text.splitlines()]


def test_an_old_id_gets_a_gap_after_the_bound_and_a_recent_one_its_changes(
        services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, change_log={"catch_up_max_entries": MAX_ENTRIES}))
    first = backend_create(backend.url, {"export_type": "report_export"}, tenant="t2").json()["data"]["task_id"]
    wait_status(backend.url, first, tenant="t2")
    (start,) = _feed(backend, "follow=false")  # the log's end, where an old Last-Event-ID points
    assert set(start) == {"position"} and start["position"]
    ids = [backend_create(backend.url, {"export_type": "report_export"}, tenant="t2").json()["data"]["task_id"]
           for _ in range(40)]  # each makes several entries (created, running, progress, completed)
    for task_id in ids:
        wait_status(backend.url, task_id, tenant="t2")
    recent = _feed(backend, "follow=false")[-1]["position"]
    mine = backend_create(backend.url, {"export_type": "report_export"}, tenant="t1").json()["data"]["task_id"]
    wait_status(backend.url, mine, tenant="t1")
    everything = _feed(backend, f"after={start['position']}&follow=false")
    assert sum("id" in line for line in everything) > MAX_ENTRIES, "the log must be longer than the bound"

    old = _feed(backend, f"after={start['position']}&tenant=t1&follow=false")
    assert "gap" in old[-1], old[-3:]
    assert old[-1]["position"] == everything[-1]["position"], "the gap names the log's end, where to go on"
    assert not any(line.get("task_id") == mine for line in old), "t1's changes lie past the bound: a gap instead"

    caught_up = _feed(backend, f"after={recent}&tenant=t1&follow=false")
    assert not any("gap" in line for line in caught_up)
    assert {line.get("tenant") for line in caught_up if "id" in line} == {"t1"}
    assert caught_up[-2]["task"]["status"] == "COMPLETED" and caught_up[-2]["task_id"] == mine

    gateway_feed = _feed(backend, f"after={start['position']}&follow=false")  # no tenant: every entry, no bound
    assert not any("gap" in line for line in gateway_feed)
