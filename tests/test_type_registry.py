"""One registry of export types, owned by the backend: reloaded from its file without a restart, refused
whole when broken, served with an ETag, and each task bound to the definition it was created under."""
from __future__ import annotations

import signal
from typing import Any, Callable

import httpx
import pytest

from tests.conftest import backend_config, synthetic_type
from tests.helpers import assert_envelope_error, backend_create, wait_status
from tests.procs import Service, backend_headers, wait_until

RELOAD_SEC = 10  # a type added to the file is listed and submittable within this


def listed(backend: Service) -> dict[str, Any]:
    items = httpx.get(f"{backend.url}/export-types", headers=backend_headers(), timeout=5).json()["data"]["items"]
    return {item["export_type"]: item for item in items}


def etag_answer(backend: Service, tag: str) -> httpx.Response:
    return httpx.get(f"{backend.url}/export-types", headers=backend_headers(**{"If-None-Match": tag}), timeout=5)


def edit(backend: Service, change: Callable[[dict[str, Any]], None]) -> None:
    change(backend.config)
    backend.write_config()


def rows_of(backend: Service, task_id: str) -> int:
    done = wait_status(backend.url, task_id, timeout=30)
    assert done["status"] == "COMPLETED", done
    return int(done["result"]["rows"])


@pytest.fixture(scope="module")
def backend(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Service:
    """One backend for the module (each test edits types of its own): one worker, so a slow task holds it."""
    types = {"slow_export": synthetic_type("orders", 20000, 5, fault={"delay_sec": 30}),
             "orders_small": synthetic_type("orders", 1000, 1, formats=["csv", "jsonl"])}
    return module_services("backend_stub", backend_config(tmp_path_factory.mktemp("registry"), export_types=types,
                                                          workers=1), name="backend")


def test_a_type_added_to_the_file_is_listed_and_submittable_within_10s(backend: Service) -> None:
    edit(backend, lambda c: c["export_types"].update(users_new=synthetic_type("users", 500, 2, formats=["jsonl"])))
    wait_until(lambda: "users_new" in listed(backend), RELOAD_SEC, what="the new type to be listed")
    created = backend_create(backend.url, {"export_type": "users_new"})
    assert created.status_code == 201, created.text
    assert created.json()["data"]["format"] == "jsonl"
    assert rows_of(backend, created.json()["data"]["task_id"]) == 500


def test_a_broken_type_is_refused_with_its_line_and_the_registry_in_force_keeps_serving(backend: Service) -> None:
    before = listed(backend)
    edit(backend, lambda c: c["export_types"].update(
        broken=synthetic_type("orders", 10, formats=["csv"], filters={"x": {"type": "integer", "column": "nope"}}),
        added_too=synthetic_type("users", 10)))
    wait_until(lambda: "config reload refused" in backend.log(), RELOAD_SEC, what="the reload to be refused")
    refusal = next(line for line in backend.log().splitlines() if "config reload refused" in line)
    assert "export_types.broken" in refusal and "(line " in refusal and "nope" in refusal, refusal
    assert listed(backend) == before  # nothing of the broken file applied, not even its valid type
    scraped = httpx.get(f"{backend.url}/metrics", headers=backend_headers()).text
    assert 'backend_config_reloads_total{outcome="refused"} 1.0' in scraped
    assert_envelope_error(backend_create(backend.url, {"export_type": "added_too"}), 422, 42200)
    created = backend_create(backend.url, {"export_type": "orders_small"})
    assert created.status_code == 201 and rows_of(backend, created.json()["data"]["task_id"]) == 1000
    edit(backend, lambda c: c["export_types"].pop("broken"))
    wait_until(lambda: "added_too" in listed(backend), RELOAD_SEC, what="the mended file to apply")


def test_a_task_keeps_the_definition_it_was_created_under_through_edits_and_removal(backend: Service) -> None:
    edit(backend, lambda c: c["export_types"].update(kept=synthetic_type("orders", 1000, 1, formats=["csv", "jsonl"])))
    wait_until(lambda: "kept" in listed(backend), RELOAD_SEC, what="the type to be listed")
    blocker = backend_create(backend.url, {"export_type": "slow_export"}).json()["data"]["task_id"]
    wait_status(backend.url, blocker, {"RUNNING"})  # the only worker is busy: the next tasks wait in the queue
    queued = backend_create(backend.url, {"export_type": "kept"}).json()["data"]["task_id"]
    removed = backend_create(backend.url, {"export_type": "kept", "format": "jsonl"}).json()["data"]["task_id"]
    tag = httpx.get(f"{backend.url}/export-types", headers=backend_headers(), timeout=5).headers["etag"]

    def shrink(config: dict[str, Any]) -> None:
        config["export_types"]["kept_tiny"] = synthetic_type("orders", 10, 1, formats=["csv"])
        config["export_types"]["kept"] = synthetic_type("orders", 10, 1, formats=["csv"])

    edit(backend, shrink)
    wait_until(lambda: "kept_tiny" in listed(backend), RELOAD_SEC, what="the edit to apply")
    edit(backend, lambda c: c["export_types"].pop("kept"))  # a removal applies only when asked for on purpose
    applied = httpx.post(f"{backend.url}/internal/reload", params={"allow_removals": "true"},
                         headers=backend_headers(), timeout=10)
    assert applied.status_code == 200, applied.text
    assert "kept" not in listed(backend)
    assert etag_answer(backend, tag).status_code == 200
    httpx.post(f"{backend.url}/exports/{blocker}/cancel", headers=backend_headers("t1"), timeout=5)
    # created under the 1000-row definition offering jsonl: so they run, though the file now says otherwise
    assert rows_of(backend, queued) == 1000
    assert rows_of(backend, removed) == 1000
    assert wait_status(backend.url, removed)["result"]["format"] == "jsonl"
    assert_envelope_error(backend_create(backend.url, {"export_type": "kept"}), 422, 42200)
    assert rows_of(backend, backend_create(backend.url, {"export_type": "kept_tiny"}).json()["data"]["task_id"]) == 10


def test_export_types_carries_an_etag_answered_with_304_until_the_registry_changes(backend: Service) -> None:
    first = httpx.get(f"{backend.url}/export-types", headers=backend_headers(), timeout=5)
    tag = first.headers["etag"]
    again = httpx.get(f"{backend.url}/export-types", headers=backend_headers(**{"If-None-Match": tag}), timeout=5)
    assert again.status_code == 304 and again.headers["etag"] == tag and again.content == b""
    # a tenant's request (the public route's) and the gateway's own differ: only the gateway's has the allow-list
    tenant = httpx.get(f"{backend.url}/export-types", headers=backend_headers("t1"), timeout=5)
    assert "callbacks" not in tenant.json()["data"] and tenant.headers["etag"] != tag
    assert first.json()["data"]["callbacks"] == {"allow_hosts": [], "allow_networks": []}
    formats = ["jsonl", "csv"] if listed(backend)["orders_small"]["formats"] == ["csv", "jsonl"] else ["csv", "jsonl"]
    edit(backend, lambda c: c["export_types"]["orders_small"].update(formats=formats))
    backend.signal(signal.SIGHUP)  # as well as the file event: either reloads, and twice changes nothing more
    wait_until(lambda: listed(backend)["orders_small"]["formats"] == formats, RELOAD_SEC, what="the new formats")
    assert etag_answer(backend, tag).status_code == 200


def test_a_setting_a_reload_cannot_apply_is_named_and_waits_for_a_restart(backend: Service) -> None:
    edit(backend, lambda c: c.update(workers=3))
    wait_until(lambda: "restart_required" in backend.log(), RELOAD_SEC, what="the restart warning")
    assert '"workers"' in next(line for line in backend.log().splitlines() if "restart_required" in line)
