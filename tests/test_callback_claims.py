"""Two backends on one Redis deliver each notification once: every delivery is claimed in the store.

Each backend polls the due callbacks far more often than the receiver answers; without claims both
would send what the other is still sending. Only a backend killed mid-delivery lets the other send
its notifications again, once, after their claims ran out.
"""
from __future__ import annotations

import collections
import re
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import backend_config
from tests.helpers import backend_create, backend_task
from tests.procs import RedisServer, Service, backend_headers, wait_until
from tests.receiver import Receiver

TINY = {"tiny_export": {"dataset": "report", "rows": 20, "seed": 1}}


def two_backends(services: Callable[..., Service], tmp_path: Path, redis: RedisServer,
                 **callbacks: Any) -> list[Service]:
    config = backend_config(tmp_path, redis.url, redis_prefix=f"claims{time.time_ns()}", export_types=TINY,
                            callbacks={"allow_networks": ["127.0.0.0/8"], "poll_interval_sec": 0.05, **callbacks})
    return [services("backend_stub", dict(config), name=f"backend-{n}") for n in range(2)]


def submit(backends: list[Service], receiver: Receiver, n: int) -> list[str]:
    return [backend_create(backends[i % 2].url, {"export_type": "tiny_export", "callback_url": receiver.url},
                           tenant="demo").json()["data"]["task_id"] for i in range(n)]


def delivered(url: str, task_ids: list[str]) -> bool:
    return all(backend_task(url, t, "demo")["callback"]["state"] == "DELIVERED" for t in task_ids)


def receipts(receiver: Receiver) -> collections.Counter[str]:
    """How many times each notification (webhook-id: one per task and callback_seq) arrived."""
    with receiver.lock:
        return collections.Counter(r.headers["webhook-id"] for r in receiver.received)


def taken_over(backend: Service) -> float:
    text = httpx.get(f"{backend.url}/metrics", headers=backend_headers(), timeout=5).text
    match = re.search(r"^backend_callback_claims_taken_over_total (\S+)$", text, re.MULTILINE)
    assert match is not None, "the takeover counter is exported"
    return float(match[1])


def test_two_backends_deliver_each_notification_once_to_a_receiver_slower_than_their_polls(
        services: Callable[..., Service], tmp_path: Path, redis_server: RedisServer) -> None:
    backends = two_backends(services, tmp_path, redis_server)
    with Receiver(delay_sec=0.5) as receiver:  # ten poll intervals per answer
        task_ids = submit(backends, receiver, 24)
        wait_until(lambda: delivered(backends[0].url, task_ids), 30, interval=0.2, what="every delivery")
        counts = receipts(receiver)
    assert set(counts) == {f"msg_{t}_1" for t in task_ids}
    assert [webhook_id for webhook_id, n in counts.items() if n > 1] == [], "a notification arrived twice"
    assert all('"msg": "callback delivered"' in b.log() for b in backends), "both backends delivered some"
    assert [taken_over(b) for b in backends] == [0, 0]


def test_a_backend_killed_mid_delivery_costs_each_of_its_notifications_at_most_one_resend(
        services: Callable[..., Service], tmp_path: Path, redis_server: RedisServer) -> None:
    # 4 deliveries in flight per backend, 8 tasks: when all 8 have arrived, each backend is mid-way through 4
    backends = two_backends(services, tmp_path, redis_server, concurrency=4, per_tenant_concurrency=4,
                            timeout_sec=2, claim_lease_sec=3)
    killed, survivor = backends
    with Receiver(delay_sec=1.5) as receiver:
        task_ids = submit(backends, receiver, 8)
        wait_until(lambda: receiver.count() == 8, 15, interval=0.02, what="every notification to be in flight")
        killed.kill()
        wait_until(lambda: delivered(survivor.url, task_ids), 30, interval=0.2, what="every delivery")
        counts = receipts(receiver)
    assert set(counts) == {f"msg_{t}_1" for t in task_ids}
    assert max(counts.values()) <= 2, f"more than one resend: {counts}"
    resent = sum(n - 1 for n in counts.values())
    assert 1 <= resent <= 4, "only what the killed backend had in flight is sent again"
    assert taken_over(survivor) == resent, "each resend is a claim taken over from the dead backend"
