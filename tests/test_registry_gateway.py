"""The gateway learns export types, formats and the callback allow-list from the backend's registry: a type or
a receiver added to backend.yaml is accepted at the edge within seconds, with no restart of either process."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from exports_client import ApiError, ExportsClient
from exports_common.config_loader import load_model
from gateway.config import GatewayConfig
from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import assert_envelope_error, upstream_calls, wait_status
from tests.procs import ROOT, Service, load_default, wait_until
from tests.receiver import Receiver

WITHIN_SEC = 10
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
EXPORTCTL = str(Path(sys.executable).parent / "exportctl")


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> tuple[Service, Service]:
    workdir = tmp_path_factory.mktemp("registry-gw")
    types = {"orders_small": synthetic_type("orders", 1000, 1, formats=["csv", "jsonl"])}
    backend = module_services("backend_stub", backend_config(workdir, export_types=types), name="backend")
    config = gateway_config(workdir, backend.url)
    for route in config["routes"]:  # nothing of the registry in gateway.yaml: all of it is learned
        for plugin in route["plugins"]:
            if isinstance(plugin, dict) and "validate" in plugin:
                plugin["validate"].pop("callback", None)
                plugin["validate"].pop("export_types", None)
    return backend, module_services("gateway", config, name="gateway")


def submit(gateway: Service, **body: Any) -> httpx.Response:
    return httpx.post(f"{gateway.url}/api/v1/exports", json=body, headers=AUTH, timeout=10)


def edit_backend(backend: Service, change: Callable[[dict[str, Any]], None]) -> None:
    change(backend.config)
    backend.write_config()


def test_a_type_added_to_backend_yaml_is_listed_and_submittable_through_the_gateway_within_10s(
        stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    assert_envelope_error(submit(gateway, export_type="users_added"), 422, 42200)
    edit_backend(backend, lambda c: c["export_types"].update(users_added=synthetic_type("users", 300, 3,
                                                                                        formats=["jsonl"])))
    started = time.monotonic()

    def listed() -> bool:
        items = httpx.get(f"{gateway.url}/api/v1/export-types", headers=AUTH, timeout=5).json()["data"]["items"]
        return any(item["export_type"] == "users_added" for item in items)

    wait_until(listed, WITHIN_SEC, what="the new type listed by the gateway")
    accepted = wait_until(lambda: (r := submit(gateway, export_type="users_added")).status_code == 202 and r,
                          WITHIN_SEC - (time.monotonic() - started), what="the new type accepted by the gateway")
    assert time.monotonic() - started < WITHIN_SEC
    task_id = accepted.json()["data"]["task_id"]
    done = wait_status(gateway.url, task_id, path="/api/v1/exports/", headers=AUTH, timeout=30)
    assert done["status"] == "COMPLETED" and done["format"] == "jsonl" and done["result"]["rows"] == 300


def test_an_unknown_type_or_format_is_refused_at_the_edge_by_the_registry_and_by_exportctl(
        stack: tuple[Service, Service]) -> None:
    gateway = stack[1]
    submit(gateway, export_type="orders_small")  # the registry learned (at start, or by this miss)
    before = upstream_calls(gateway.url, "submit")
    body = assert_envelope_error(submit(gateway, export_type="orders_small", format="xml"), 422, 42200)
    assert body["data"]["field"] == "format" and "offers csv, jsonl" in body["data"]["reason"], body
    body = assert_envelope_error(submit(gateway, export_type="no_such_type"), 422, 42200)
    assert body["data"]["field"] == "export_type" and "orders_small" in body["data"]["reason"], body
    assert upstream_calls(gateway.url, "submit") == before  # refused by the gateway itself
    # the SDK and exportctl send any format name: the server's 422 is what refuses it
    with ExportsClient(gateway.url, DEMO_KEY) as client, pytest.raises(ApiError) as refused:
        client.submit("orders_small", format="parquet_v9")
    assert refused.value.status == 422 and refused.value.data["field"] == "format"
    cli = subprocess.run([EXPORTCTL, "submit", "orders_small", "--format", "xml", "--url", gateway.url,
                          f"--api-key={DEMO_KEY}"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert cli.returncode == 2 and "offers csv, jsonl" in cli.stderr, cli.stderr


def test_a_broken_backend_yaml_leaves_the_gateway_on_the_registry_in_force(stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    edit_backend(backend, lambda c: c["export_types"].update(
        half_written={"source": {"kind": "synthetic", "dataset": "orders"}, "formats": ["xlsx"]},
        valid_beside=synthetic_type("users", 10)))
    wait_until(lambda: "config reload refused" in backend.log(), WITHIN_SEC, what="the backend to refuse the file")
    assert submit(gateway, export_type="orders_small").status_code == 202
    assert_envelope_error(submit(gateway, export_type="valid_beside"), 422, 42200)
    edit_backend(backend, lambda c: c["export_types"].pop("half_written"))
    wait_until(lambda: submit(gateway, export_type="valid_beside").status_code == 202, WITHIN_SEC,
               what="the mended file's type to be accepted")


def test_a_receiver_allowed_only_in_backend_yaml_gets_its_webhook_with_no_restart(
        stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    with Receiver() as receiver:
        body = assert_envelope_error(submit(gateway, export_type="orders_small", callback_url=receiver.url), 422,
                                     42200)
        assert body["data"]["field"] == "callback_url", body
        edit_backend(backend, lambda c: c["callbacks"].update(allow_hosts=[], allow_networks=["127.0.0.0/8"]))
        accepted = wait_until(
            lambda: (r := submit(gateway, export_type="orders_small", callback_url=receiver.url)).status_code == 202
            and r, WITHIN_SEC, what="the gateway to accept the receiver")
        task_id = accepted.json()["data"]["task_id"]
        wait_until(receiver.count, 30, what="the webhook")
        payload = json.loads(receiver.received[0].body)
        assert payload["task_id"] == task_id and payload["status"] == "COMPLETED"
        # and taken back: refused at the edge again after the next reload
        edit_backend(backend, lambda c: c["callbacks"].update(allow_networks=[]))
        wait_until(lambda: submit(gateway, export_type="orders_small", callback_url=receiver.url).status_code == 422,
                   WITHIN_SEC, what="the receiver refused again")


def test_while_the_backend_is_down_the_gateway_keeps_the_registry_it_learned_last(
        stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    backend.stop()
    body = assert_envelope_error(submit(gateway, export_type="no_such_type"), 422, 42200)
    assert body["data"]["field"] == "export_type"
    queued = submit(gateway, export_type="orders_small")  # a known type: held in the outbox until it is back
    assert queued.status_code == 202 and queued.json()["data"].get("degraded") is True, queued.text


@pytest.mark.inprocess
def test_a_type_list_or_callback_allow_list_left_in_gateway_yaml_loads_with_a_warning_naming_backend_yaml(
        tmp_path: Path) -> None:
    assert load_model(ROOT / "config/gateway.yaml", GatewayConfig).load_warnings() == []
    config = load_default("gateway.yaml")
    submit_route = next(r for r in config["routes"] if r["name"] == "submit")
    validate = next(p for p in submit_route["plugins"] if isinstance(p, dict) and "validate" in p)["validate"]
    validate.update(export_types=["order_export"], callback={"allow_hosts": ["hooks.internal"]})
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    warnings = load_model(tmp_path / "gateway.yaml", GatewayConfig).load_warnings()
    assert len(warnings) == 2 and all(w.startswith("route submit: validate.") for w in warnings), warnings
    assert "only narrows" in warnings[0] and "move these to backend.yaml" in warnings[1]
