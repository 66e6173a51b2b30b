"""No receiver can stall callbacks: one tenant's 100 hostile receivers never delay another tenant's delivery.

Tenant demo's tasks call back to receivers that fail in every way (a name that does
not resolve, a reset, silence until the timeout, a status line one byte a second, an
endless body, a redirect); demo2's task calls a well-behaved receiver. demo2's delay
(delivery time minus the task's completion) is measured with and without the flood.
"""
from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from backend_stub.callbacks import CallbackSender
from backend_stub.config import BackendConfig
from exports_common.timefmt import parse_rfc3339
from tests.conftest import backend_config, synthetic_type
from tests.helpers import backend_create, wait_status
from tests.procs import Service, backend_headers, wait_until
from tests.receiver import HostileReceiver, Receiver

FLOOD_TASKS = 100
CALLBACKS = {"allow_networks": ["127.0.0.0/8"], "timeout_sec": 2, "retry_delays_sec": [0.1] * 30,
             "concurrency": 8, "poll_interval_sec": 0.1}
TINY = {"tiny_export": synthetic_type("report", 20)}


def fairness_backend(start: Callable[..., Service], workdir: Path) -> Service:
    return start("backend_stub", backend_config(workdir, callbacks=CALLBACKS, export_types=TINY, workers=4))


@contextlib.contextmanager
def hostile_urls() -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(HostileReceiver(mode)).url for mode in HostileReceiver.MODES]
        redirect = stack.enter_context(Receiver([302] * 100_000))
        yield [*urls, redirect.url, "http://nothing.invalid/hook", "http://127.0.0.1:9/closed-port"]


def start_flood(backend: Service, urls: list[str]) -> list[str]:
    """demo's tasks, each calling back to a hostile receiver; returns once every one is being retried."""
    ids = [backend_create(backend.url, {"export_type": "tiny_export", "callback_url": urls[i % len(urls)]},
                          tenant="demo").json()["data"]["task_id"] for i in range(FLOOD_TASKS)]
    wait_until(lambda: sum(c["attempts"] > 0 for c in flood_callbacks(backend)) > FLOOD_TASKS // 2,
               60, interval=0.2, what="the flood's deliveries to be under way")
    return ids


def flood_callbacks(backend: Service) -> list[dict[str, Any]]:
    resp = httpx.get(f"{backend.url}/exports?limit=500", headers=backend_headers("demo"), timeout=10)
    return [t["callback"] for t in resp.json()["data"]["items"]]


def delivered_past(receiver: Receiver, seen: int) -> bool:
    return receiver.count() > seen


def delivery_delays(backend: Service, receiver: Receiver, tasks: int = 3) -> list[float]:
    """demo2's delay from completion to delivery, for `tasks` tasks one after another."""
    delays = []
    for _ in range(tasks):
        seen = receiver.count()
        task_id = backend_create(backend.url, {"export_type": "tiny_export", "callback_url": receiver.url},
                                 tenant="demo2").json()["data"]["task_id"]
        done = wait_status(backend.url, task_id, timeout=30, tenant="demo2")
        wait_until(functools.partial(delivered_past, receiver, seen), 60, interval=0.02, what="demo2's callback")
        received_wall = receiver.received[seen].at + (time.time() - time.monotonic())
        delays.append(received_wall - parse_rfc3339(done["updated_at"]))
    return delays


def test_hostile_receivers_never_delay_another_tenant(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = fairness_backend(services, tmp_path)
    with Receiver() as good, hostile_urls() as urls:
        quiet = delivery_delays(backend, good)
        flood = start_flood(backend, urls)
        loud = delivery_delays(backend, good)
        wait_until(lambda: all(c["attempts"] >= 1 for c in flood_callbacks(backend)), 30,
                   what="every hostile delivery to be tried")
        states = flood_callbacks(backend)
    print(f"demo2 delivery delay: quiet max {max(quiet):.3f} s, under flood max {max(loud):.3f} s")
    # the schedule says "at once": a poll interval plus one delivery, with room for a loaded machine
    assert max(loud) < 1.5, (quiet, loud)
    assert len(states) == len(flood) and all(s["last_error"] for s in states), "every hostile delivery moved on"
    log = backend.log()
    assert "Traceback" not in log
    assert log.count("callback dispatch failed") == 0



def test_free_slots_go_round_robin_and_no_tenant_passes_its_share() -> None:
    config = BackendConfig.model_validate({"export_types": TINY, "callbacks": {"concurrency": 6}})
    sender = CallbackSender(config, store=None)  # type: ignore[arg-type]  # pick() never touches the store
    queues = {"a": [f"a{i}" for i in range(100)], "b": ["b0", "b1"], "c": ["c0"]}
    assert sender.share == 3
    assert sender.pick(queues) == ["a0", "b0", "c0", "a1", "b1", "a2"]
    sender._in_flight = {"a0": "a", "a1": "a", "a2": "a"}  # a holds its share: the rest goes to the others
    assert sender.pick(queues) == ["c0", "b0", "b1"]  # c was served longest ago
