"""A slow synchronous endpoint as an export type (`source: {kind: http}`), through the whole stack.

The endpoint is a real Starlette process (tests/slow_endpoint.py) that waits, refuses, asks to be
called later, fails once, hangs or streams a large body; the backend and the gateway are real too.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.helpers import backend_create, wait_status
from tests.procs import ROOT, Service, free_port, wait_until

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
API = "/api/v1/exports"


class Endpoint:
    """The slow endpoint's process; `calls(key)` is what it saw for one Idempotency-Key."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(workdir / "endpoint.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.slow_endpoint:app", "--host",
                                      "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200, 20,
                   what="the slow endpoint to answer")

    def calls(self, key: str) -> list[dict[str, Any]]:
        return [c for c in httpx.get(f"{self.url}/calls", timeout=5).json() if c["key"] == key]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def http_type(url: str, *, method: str = "POST", timeout_sec: float = 30, **fields: Any) -> dict[str, Any]:
    return {"source": {"kind": "http", "url": url, "method": method, "timeout_sec": timeout_sec},
            "formats": ["raw"], "filters": {"region": {"type": "string"}}, **fields}


def endpoint_types(url: str) -> dict[str, Any]:
    host_name_url = url.replace("127.0.0.1", "localhost")  # resolves to a loopback address nobody allowed
    return {
        "ep_ok": http_type(f"{url}/ok?delay=1"),
        "ep_get": http_type(f"{url}/ok", method="GET"),
        "ep_slow": http_type(f"{url}/ok?delay=4"),
        "ep_refuse": http_type(f"{url}/refuse"),
        "ep_later": http_type(f"{url}/later"),
        "ep_flaky": http_type(f"{url}/flaky"),
        "ep_hang": http_type(f"{url}/hang", timeout_sec=1.5, max_attempts=2),
        "ep_big_20": http_type(f"{url}/big?mib=20"),
        "ep_big_100": http_type(f"{url}/big?mib=100"),
        "ep_private": http_type(f"{host_name_url}/ok"),
    }


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    running = Endpoint(tmp_path_factory.mktemp("endpoint"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], endpoint: Endpoint,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Service, Service]:
    workdir = tmp_path_factory.mktemp("stack")
    backend = module_services("backend_stub", backend_config(
        workdir, workers=4, export_types=endpoint_types(endpoint.url), sources={"allow_hosts": ["127.0.0.1"]}))
    gateway = module_services("gateway", gateway_config(workdir, backend.url))
    return backend, gateway


def submit(gateway: Service, export_type: str, **body: Any) -> str:
    resp = httpx.post(f"{gateway.url}{API}", headers=AUTH, timeout=10,
                      json={"export_type": export_type, "filters": {"region": "eu-west"}, **body})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["data"]["task_id"])


def final(gateway: Service, task_id: str, timeout: float = 30) -> dict[str, Any]:
    return wait_status(gateway.url, task_id, path=f"{API}/", headers=AUTH, timeout=timeout)


def test_each_task_calls_the_endpoint_once_with_its_id_as_idempotency_key_and_serves_the_answer(
        stack: tuple[Service, Service], endpoint: Endpoint) -> None:
    _, gateway = stack
    posted, got = submit(gateway, "ep_ok"), submit(gateway, "ep_get")
    for task_id in (posted, got):
        done = final(gateway, task_id)
        assert done["status"] == "COMPLETED" and done["attempt"] == 1, done
        assert done["result"]["rows"] == 0 and done["result"]["format"] == "raw"
        file = httpx.get(done["result"]["download_url"], timeout=10)  # the signed link
        assert file.status_code == 200 and file.text == "region,total\neu-west,42\n"
        assert file.headers["content-type"].startswith("text/csv")
        assert f'filename="{task_id}.csv"' in file.headers["content-disposition"]
        assert file.headers["x-content-type-options"] == "nosniff"
    (call,) = endpoint.calls(posted)
    assert (call["method"], call["tenant"], json.loads(call["body"])) == ("POST", "demo", {"region": "eu-west"})
    (call,) = endpoint.calls(got)
    assert (call["method"], call["query"], call["body"]) == ("GET", "region=eu-west", "")


def test_a_refusal_fails_the_task_after_one_call_with_the_endpoints_status_and_message(
        stack: tuple[Service, Service], endpoint: Endpoint) -> None:
    task_id = submit(stack[1], "ep_refuse")
    done = final(stack[1], task_id)
    assert done["status"] == "FAILED" and done["error"]["code"] == "ENDPOINT_REFUSED", done
    assert "400" in done["error"]["message"] and "xx-north does not exist" in done["error"]["message"]
    assert done["error"]["retryable"] is False
    assert len(endpoint.calls(task_id)) == 1


def test_a_429_is_called_again_no_sooner_than_its_retry_after(stack: tuple[Service, Service],
                                                              endpoint: Endpoint) -> None:
    task_id = submit(stack[1], "ep_later")
    done = final(stack[1], task_id)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2, done
    first, second = endpoint.calls(task_id)
    assert second["at"] - first["at"] >= 2.0 and second["key"] == first["key"] == task_id


def test_a_500_then_a_200_completes_on_the_second_attempt(stack: tuple[Service, Service],
                                                         endpoint: Endpoint) -> None:
    task_id = submit(stack[1], "ep_flaky")
    done = final(stack[1], task_id)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2, done
    assert len(endpoint.calls(task_id)) == 2


def test_a_call_past_its_timeout_is_closed_and_retried_and_past_the_tasks_timeout_is_timeout(
        stack: tuple[Service, Service], endpoint: Endpoint) -> None:
    retried = submit(stack[1], "ep_hang")
    done = final(stack[1], retried)
    assert done["status"] == "FAILED" and "timeout_sec" in done["error"]["message"], done
    calls = endpoint.calls(retried)
    assert len(calls) == 2 and all(c["left_at"] is not None for c in calls), calls

    timed_out = submit(stack[1], "ep_slow", timeout_sec=2)  # the endpoint takes 4 s; the task may take 2
    hung = submit(stack[1], "ep_hang", timeout_sec=2)
    for task_id in (timed_out, hung):  # read from the backend: the gateway's status route would re-run a TIMEOUT
        assert wait_status(stack[0].url, task_id, headers={"X-Tenant-Id": "demo"})["status"] == "TIMEOUT"
        assert wait_until(functools.partial(all_closed, endpoint, task_id), 5, what="the endpoint to see it closed")


def all_closed(endpoint: Endpoint, key: str) -> bool:
    return all(c["left_at"] for c in endpoint.calls(key))


def test_cancel_closes_the_call_in_flight(stack: tuple[Service, Service], endpoint: Endpoint) -> None:
    task_id = submit(stack[1], "ep_hang", timeout_sec=60)
    wait_until(lambda: endpoint.calls(task_id), 10, what="the call to reach the endpoint")
    cancelled = httpx.post(f"{stack[1].url}{API}/{task_id}/cancel", headers=AUTH, timeout=10)
    assert cancelled.status_code == 200, cancelled.text
    started = time.time()
    wait_until(lambda: endpoint.calls(task_id)[0]["left_at"], 5, what="the endpoint to see the call closed")
    assert endpoint.calls(task_id)[0]["left_at"] - started < 2.0


def test_an_endpoint_resolving_to_a_private_address_nobody_allowed_is_never_called(
        stack: tuple[Service, Service], endpoint: Endpoint) -> None:
    task_id = submit(stack[1], "ep_private")
    done = final(stack[1], task_id)
    assert done["status"] == "FAILED" and done["error"]["code"] == "ENDPOINT_NOT_ALLOWED", done
    assert "allow_hosts" in done["error"]["message"]
    assert endpoint.calls(task_id) == []


def _peak_rss_growth(backend: Service, gateway: Service, export_type: str) -> tuple[int, int]:
    """(bytes stored, the backend's RSS growth at its peak) over one export."""
    before, peak, stop = backend.rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], backend.rss_bytes())
            stop.wait(0.02)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        done = final(gateway, submit(gateway, export_type), timeout=60)
    finally:
        stop.set()
        sampler.join()
    assert done["status"] == "COMPLETED", done
    return int(done["result"]["bytes"]), peak[0] - before


def test_a_large_answer_streams_to_the_store_in_flat_memory(stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    _peak_rss_growth(backend, gateway, "ep_big_20")  # the first run's one-time allocations
    small_bytes, small_growth = _peak_rss_growth(backend, gateway, "ep_big_20")
    large_bytes, large_growth = _peak_rss_growth(backend, gateway, "ep_big_100")
    assert (small_bytes, large_bytes) == (20 << 20, 100 << 20)
    assert large_growth - small_growth < 16 << 20, (small_growth, large_growth)  # 80 MiB more, no more memory


def test_a_backend_killed_mid_call_calls_once_more_with_the_same_key(services: Callable[..., Service],
                                                                     endpoint: Endpoint, tmp_path: Path) -> None:
    types = {"ep_slow": http_type(f"{endpoint.url}/ok?delay=3")}  # killed within these 3 s
    backend = services("backend_stub", backend_config(tmp_path, workers=1, lease_sec=1, export_types=types,
                                                      sources={"allow_hosts": ["127.0.0.1"]}))
    task_id = backend_create(backend.url, {"export_type": "ep_slow", "filters": {"region": "eu-west"}}).json()[
        "data"]["task_id"]
    wait_until(lambda: endpoint.calls(task_id), 10, what="the call to reach the endpoint")
    backend.kill()
    backend.start()
    done = wait_status(backend.url, task_id, timeout=30)
    assert done["status"] == "COMPLETED" and done["attempt"] == 2, done
    calls = endpoint.calls(task_id)
    assert len(calls) == 2 and {c["key"] for c in calls} == {task_id}
