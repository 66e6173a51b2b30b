"""Signed callbacks from the backend to a real receiver."""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Callable

import httpx

from exports_common import webhooks
from tests.conftest import DEMO_KEY, PUBLIC_URL, WEBHOOK_SECRETS, backend_config, gateway_config
from tests.helpers import backend_create, backend_task, wait_status
from tests.procs import Service, backend_headers, wait_until
from tests.receiver import Receiver

SECRET = WEBHOOK_SECRETS["demo"]
LOOPBACK = {"allow_networks": ["127.0.0.0/8"]}


def callback_backend(services: Callable[..., Service], tmp_path: Path, **callbacks: Any) -> Service:
    return services("backend_stub", backend_config(tmp_path, callbacks=LOOPBACK | callbacks))


def callback_state(backend: Service, task_id: str) -> dict[str, Any]:
    return backend_task(backend.url, task_id, "demo")["callback"]


def test_completed_task_is_delivered_signed(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path)
    with Receiver() as receiver:
        task_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": receiver.url},
                                 tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: callback_state(backend, task_id)["state"] == "DELIVERED", 15, what="delivery")
        assert receiver.count() == 1
        got = receiver.received[0]
    assert webhooks.verify(SECRET, got.headers, got.body)
    assert not webhooks.verify(SECRET, got.headers, got.body + b" ")
    assert got.headers["webhook-id"] == f"msg_{task_id}_1"
    body = json.loads(got.body)
    assert body["task_id"] == task_id and body["status"] == "COMPLETED" and body["callback_seq"] == 1
    assert body["attempt"] == 1 and body["error"] is None and body["expire_at"].endswith("Z")
    assert body["download_url"].startswith(f"{PUBLIC_URL}/api/v1/exports/{task_id}/download?expires=")
    assert callback_state(backend, task_id) == {"state": "DELIVERED", "attempts": 1, "last_error": None}


def test_retries_at_1_4_16_offsets_with_the_same_webhook_id(services: Callable[..., Service],
                                                            tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path)
    with Receiver([500, 503]) as receiver:
        task_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": receiver.url},
                                 tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: callback_state(backend, task_id)["state"] == "DELIVERED", 20, what="delivery")
        tries = list(receiver.received)
    assert len(tries) == 3
    assert {t.headers["webhook-id"] for t in tries} == {f"msg_{task_id}_1"}
    assert {json.loads(t.body)["callback_seq"] for t in tries} == {1}
    gaps = [b.at - a.at for a, b in itertools.pairwise(tries)]
    assert 0.9 <= gaps[0] <= 1.6 and 3.9 <= gaps[1] <= 4.6, gaps
    assert all(webhooks.verify(SECRET, t.headers, t.body) for t in tries)
    assert callback_state(backend, task_id)["attempts"] == 3


def test_receiver_down_for_all_tries_marks_failed_and_polling_still_works(services: Callable[..., Service],
                                                                          tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path, retry_delays_sec=[0.2, 0.2, 0.2])
    with Receiver([500] * 10) as receiver:
        task_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": receiver.url},
                                 tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: callback_state(backend, task_id)["state"] == "FAILED", 15, what="FAILED")
        assert receiver.count() == 4
    state = callback_state(backend, task_id)
    assert state["attempts"] == 4 and "500" in state["last_error"]
    assert backend_task(backend.url, task_id, "demo")["status"] == "COMPLETED"


def test_410_stops_at_once_and_redirects_are_not_followed(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path, retry_delays_sec=[0.2, 0.2, 0.2])
    with Receiver([410]) as gone, Receiver([302, 302, 302, 302]) as moved:
        gone_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": gone.url},
                                 tenant="demo").json()["data"]["task_id"]
        moved_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": moved.url},
                                  tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: callback_state(backend, gone_id)["state"] == "FAILED", 15, what="410 to stop")
        wait_until(lambda: callback_state(backend, moved_id)["state"] == "FAILED", 15, what="302s to fail")
        assert gone.count() == 1 and moved.count() == 4
    assert callback_state(backend, gone_id)["attempts"] == 1
    assert "302" in callback_state(backend, moved_id)["last_error"]


def test_backend_restart_mid_schedule_loses_no_delivery(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path, retry_delays_sec=[3])
    with Receiver([500]) as receiver:
        task_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": receiver.url},
                                 tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: receiver.count() == 1, 15, what="the first try")
        backend.kill()
        backend.start()
        wait_until(lambda: callback_state(backend, task_id)["state"] == "DELIVERED", 15, what="delivery")
        assert receiver.count() == 2
        assert receiver.received[0].headers["webhook-id"] == receiver.received[1].headers["webhook-id"]


def test_each_notification_gets_the_next_seq(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path)
    with Receiver() as receiver:
        task_id = backend_create(backend.url, {"export_type": "slow_export", "timeout_sec": 1,
                                               "callback_url": receiver.url}, tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: receiver.count() == 1, 15, what="the TIMEOUT notification")
        httpx.post(f"{backend.url}/exports/{task_id}/retry", json={"expected_attempt": 1},
                   headers=backend_headers("demo")).raise_for_status()
        httpx.post(f"{backend.url}/exports/{task_id}/cancel", headers=backend_headers("demo")).raise_for_status()
        wait_until(lambda: receiver.count() == 2, 15, what="the CANCELLED notification")
        bodies = [json.loads(r.body) for r in receiver.received]
        ids = [r.headers["webhook-id"] for r in receiver.received]
    assert [(b["status"], b["callback_seq"], b["attempt"]) for b in bodies] == [("TIMEOUT", 1, 1), ("CANCELLED", 2, 2)]
    assert bodies[0]["error"]["code"] == "TASK_TIMEOUT" and bodies[0]["download_url"] is None
    assert len(set(ids)) == 2, "receivers de-duplicate by webhook-id; two notifications, two ids"


def test_non_public_receiver_is_refused_at_delivery(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))  # no allow-list
    with Receiver() as receiver:
        by_name = receiver.url.replace("127.0.0.1", "localhost")  # a name that resolves to loopback
        task_id = backend_create(backend.url, {"export_type": "report_export", "callback_url": by_name},
                                 tenant="demo").json()["data"]["task_id"]
        wait_until(lambda: callback_state(backend, task_id)["state"] == "FAILED", 15, what="refusal")
        assert receiver.count() == 0
    assert "refused" in callback_state(backend, task_id)["last_error"]


def test_trace_continues_from_client_to_callback(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path)
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    with Receiver() as receiver:
        resp = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": "report_export",
                                                                 "callback_url": receiver.url},
                          headers={"Authorization": f"Bearer {DEMO_KEY}",
                                   "traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
        task_id = resp.json()["data"]["task_id"]
        wait_until(lambda: receiver.count() == 1, 15, what="the callback")
        assert receiver.received[0].headers["traceparent"].split("-")[1] == trace_id
    wait_status(backend.url, task_id, tenant="demo")
    assert trace_id in backend.log(), "the worker's log lines carry the trace id"


def test_slow_receiver_never_blocks_exports(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = callback_backend(services, tmp_path, timeout_sec=8)
    with Receiver(delay_sec=6) as receiver:
        slow = [backend_create(backend.url, {"export_type": "report_export", "callback_url": receiver.url},
                               tenant="demo").json()["data"]["task_id"] for _ in range(3)]
        wait_until(lambda: receiver.count() >= 1, 15, what="a delivery to be under way")
        others = [backend_create(backend.url, {"export_type": "report_export"}).json()["data"]["task_id"]
                  for _ in range(4)]
        for task_id in others:
            assert wait_status(backend.url, task_id, timeout=5)["status"] == "COMPLETED"
        assert all(callback_state(backend, t)["state"] == "PENDING" for t in slow), "receivers still answering"
        wait_until(lambda: all(callback_state(backend, t)["state"] == "DELIVERED" for t in slow), 20,
                   what="the slow deliveries")
