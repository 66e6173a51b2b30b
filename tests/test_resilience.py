"""Resilience with real faults in real processes: kill -9, SIGSTOP, injected 503s."""
from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.helpers import assert_envelope_error, backend_requests, upstream_calls, wait_status
from tests.procs import Service, backend_headers, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BREAKER = {"fail_max": 3, "reset_timeout_sec": 2}


def tuned(config: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """The default config with some settings replaced wherever they are given: `circuit_breaker` on every upstream
    that has one, `timeout` and `retry` in every route's policy that has them, a plugin's on every route that
    lists it."""
    for upstream in config["upstreams"].values():
        if "circuit_breaker" in settings and "circuit_breaker" in upstream:
            upstream["circuit_breaker"] = settings["circuit_breaker"]
    for route in config["routes"]:
        policy = route.get("policy", {})
        for name in ("timeout", "retry"):
            if name in settings and name in policy:
                policy[name] = settings[name]
        for i, plugin in enumerate(route["plugins"]):
            name = plugin if isinstance(plugin, str) else next(iter(plugin))
            if name in settings:
                route["plugins"][i] = {name: settings[name]}
    return config


def resilient_gateway(services: Callable[..., Service], tmp_path: Path, backend: Service, name: str = "gateway",
                      **settings: Any) -> Service:
    defaults = {"circuit_breaker": BREAKER, "timeout": {"connect": 0.5, "read": 1, "total": 2.5}}
    return services("gateway", tuned(gateway_config(tmp_path, backend.url), **(defaults | settings)), name=name)


def breaker_state(gateway: Service) -> str:
    return httpx.get(f"{gateway.url}/admin/breakers", headers=ADMIN).json()["data"]["exports"]["state"]


def stats(gateway: Service) -> dict[str, Any]:
    return httpx.get(f"{gateway.url}/admin/stats", headers=ADMIN).json()["data"]


def test_backend_killed_then_restarted(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = resilient_gateway(services, tmp_path, backend)
    running = httpx.post(f"{gateway.url}{API}", json={"export_type": "slow_export"}, headers=AUTH).json()["data"]
    seen = wait_status(gateway.url, running["task_id"], {"RUNNING"}, path=f"{API}/", headers=AUTH)
    backend.kill()

    stale = httpx.get(f"{gateway.url}{API}/{running['task_id']}", headers=AUTH)
    assert stale.status_code == 200 and stale.headers["x-degraded"] == "stale"
    assert int(stale.headers["age"]) >= 0 and stale.json()["data"]["status"] == "RUNNING"
    assert stale.json()["data"]["progress"] >= seen["progress"]
    unknown = httpx.get(f"{gateway.url}{API}/exp-20261129-aaaaaaaaaaaaaaaaaaaa", headers=AUTH)
    assert_envelope_error(unknown, 503, 50300)
    assert int(unknown.headers["retry-after"]) >= 1

    outboxed = []
    for _ in range(4):
        resp = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=10)
        assert resp.status_code == 202 and resp.json()["data"]["degraded"] is True
        assert resp.headers["location"].endswith(resp.json()["data"]["task_id"])
        outboxed.append(resp.json()["data"]["task_id"])
    assert breaker_state(gateway) == "open"
    pending = httpx.get(f"{gateway.url}{API}/{outboxed[0]}", headers=AUTH)
    assert pending.status_code == 200 and pending.json()["data"]["status"] == "PENDING"
    assert pending.json()["data"]["degraded"] is True
    assert stats(gateway)["outbox"]["pending"] == 4

    started = time.monotonic()
    fast = httpx.get(f"{gateway.url}{API}?limit=1", headers=AUTH)
    assert_envelope_error(fast, 503, 50300)
    assert time.monotonic() - started < 0.5 and 1 <= int(fast.headers["retry-after"]) <= 2

    backend.start()
    wait_until(lambda: breaker_state(gateway) == "closed", 15, what="the breaker to close after one trial")
    wait_until(lambda: stats(gateway)["outbox"]["pending"] == 0, 15, what="the outbox to drain")
    listed = httpx.get(f"{backend.url}/exports", params={"limit": 500},
                       headers=backend_headers("demo")).json()["data"]["items"]
    ids = [t["task_id"] for t in listed]
    for task_id in outboxed:
        assert ids.count(task_id) == 1
        done = wait_status(gateway.url, task_id, path=f"{API}/", headers=AUTH)
        assert done["status"] == "COMPLETED" and done["attempt"] == 1
    assert outboxed == sorted(outboxed, key=ids.index, reverse=True), "delivered in order"
    assert stats(gateway)["outbox"]["delivered"] == 4


def test_backend_hung_timeouts_budget_breaker_and_recovery(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = resilient_gateway(services, tmp_path, backend, circuit_breaker={"fail_max": 40, "reset_timeout_sec": 2})
    submitted = httpx.post(f"{gateway.url}{API}", json={"export_type": "slow_export"}, headers=AUTH)
    task_id = submitted.json()["data"]["task_id"]
    wait_status(gateway.url, task_id, {"RUNNING"}, path=f"{API}/", headers=AUTH)
    before = upstream_calls(gateway.url, "list")
    backend.signal(signal.SIGSTOP)
    try:
        async def clients(n: int) -> list[tuple[httpx.Response, float]]:
            async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=20) as client:
                async def one() -> tuple[httpx.Response, float]:
                    started = time.monotonic()
                    resp = await client.get(API)
                    return resp, time.monotonic() - started
                return await asyncio.gather(*(one() for _ in range(n)))

        for resp, elapsed in asyncio.run(clients(20)):
            assert_envelope_error(resp, 504, 50400)
            # each try ends at its 1 s read timeout; the 2.5 s total bounds the whole request
            assert 0.95 <= elapsed <= 3.0, f"took {elapsed:.2f} s"
        calls = upstream_calls(gateway.url, "list") - before
        # 20 first tries; retries only within the budget: max(3, 20% of 20) = 4 in flight at once, 2 rounds
        assert 20 < calls <= 20 + 4 * 2, calls
        assert stats(gateway)["retry_budget"]["exports"]["exhausted_total"] > 0

        started = time.monotonic()
        stale = httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH, timeout=20)
        assert stale.headers["x-degraded"] == "stale" and 0.95 <= time.monotonic() - started <= 3.0

        wait_until(lambda: breaker_state(gateway) == "open" or (not httpx.get(
            f"{gateway.url}{API}", headers=AUTH, timeout=20).is_success and breaker_state(gateway) == "open"), 60,
            interval=0, what="the breaker to open")
        started = time.monotonic()
        fast = httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH)
        assert fast.headers["x-degraded"] == "stale" and time.monotonic() - started < 0.5
    finally:
        backend.signal(signal.SIGCONT)
    wait_until(lambda: httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH).headers.get("x-degraded") is None,
               15, interval=0.2, what="fresh answers after SIGCONT")
    assert breaker_state(gateway) == "closed"


def test_half_open_lets_exactly_one_trial_through(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = resilient_gateway(services, tmp_path, backend, retry={"attempts": 1})
    backend.signal(signal.SIGSTOP)
    try:
        for _ in range(3):
            assert httpx.get(f"{gateway.url}{API}", headers=AUTH, timeout=20).status_code in (503, 504)
        assert breaker_state(gateway) == "open"
        wait_until(lambda: httpx.get(f"{gateway.url}/admin/breakers", headers=ADMIN).json()["data"]["exports"][
            "seconds_to_trial"] == 0, 10, what="the reset timeout to pass")
        before = upstream_calls(gateway.url, "list")

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=20) as client:
                return await asyncio.gather(*(client.get(API) for _ in range(10)))

        answers = asyncio.run(burst())
        assert upstream_calls(gateway.url, "list") - before == 1
        assert sorted(r.status_code for r in answers) == [503] * 9 + [504]
    finally:
        backend.signal(signal.SIGCONT)


def test_client_errors_never_open_the_breaker(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = resilient_gateway(services, tmp_path, backend)
    for _ in range(10):
        assert httpx.get(f"{gateway.url}{API}/exp-20261129-zzzzzzzzzzzzzzzzzzzz", headers=AUTH).status_code == 404
        assert httpx.post(f"{gateway.url}{API}", json={"export_type": "order_export", "filters": {"x": 1}},
                          headers=AUTH).status_code == 422
    assert breaker_state(gateway) == "closed"


def test_injected_503s_are_absorbed_within_the_retry_budget(services: Callable[..., Service],
                                                            tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, http_fault={"error_rate": 0.1}))
    # the breaker is not under test here: at 10% failures, 5 in a row happen once in a few thousand tries
    gateway = resilient_gateway(services, tmp_path, backend, timeout={"connect": 1, "read": 5, "total": 10},
                                circuit_breaker={"fail_max": 10, "reset_timeout_sec": 2})
    before = backend_requests(backend.url)
    n = 400

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=20) as client:
            sem = asyncio.Semaphore(16)

            async def one() -> httpx.Response:
                async with sem:
                    return await client.get(API, params={"limit": 1})
            return await asyncio.gather(*(one() for _ in range(n)))

    answers = asyncio.run(load())
    failed = [r for r in answers if r.status_code != 200]
    sent = backend_requests(backend.url) - before
    assert len(failed) <= n * 0.01, (f"{len(failed)} of {n} failed for the client", stats(gateway)["retry_budget"],
                                     [(r.status_code, r.headers.get("x-gateway-attempts")) for r in failed])
    assert sent <= n * 1.2, f"the backend saw {sent} requests for {n}"
    assert "x-gateway-attempts" in answers[0].headers
    retried = [r for r in answers if r.headers["x-gateway-attempts"] != "1"]
    assert retried, "with 10% of answers failing, some requests needed a second try"


def test_gateway_restart_with_outbox_loses_nothing(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = resilient_gateway(services, tmp_path, backend)
    backend.kill()
    ids = []
    for i in range(5):
        resp = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export", "format": "jsonl"},
                          headers=AUTH | {"Idempotency-Key": f"restart-{i}"}, timeout=10)
        assert resp.status_code == 202 and resp.json()["data"]["degraded"] is True
        ids.append(resp.json()["data"]["task_id"])
    gateway.kill()
    backend.start()
    gateway.start()
    for task_id in ids:
        done = wait_status(gateway.url, task_id, path=f"{API}/", headers=AUTH, timeout=30)
        assert done["status"] == "COMPLETED" and done["result"]["format"] == "jsonl"
    replay = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export", "format": "jsonl"},
                        headers=AUTH | {"Idempotency-Key": "restart-0"})
    assert replay.headers["idempotent-replayed"] == "true" and replay.json()["data"]["task_id"] == ids[0]
    listed = httpx.get(f"{backend.url}/exports", params={"limit": 500},
                       headers=backend_headers("demo")).json()["data"]["items"]
    assert sorted(t["task_id"] for t in listed) == sorted(ids)


def test_timeout_gets_exactly_one_degraded_rerun_with_two_gateways(services: Callable[..., Service],
                                                                  tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    rerun = {"max_reruns": 1, "overrides": {"timeout_sec": 2, "degraded": True}}
    first = resilient_gateway(services, tmp_path / "a", backend, name="gateway-a", rerun=rerun)
    second = resilient_gateway(services, tmp_path / "b", backend, name="gateway-b", rerun=rerun)
    task_id = httpx.post(f"{first.url}{API}", json={"export_type": "slow_export", "timeout_sec": 1},
                         headers=AUTH).json()["data"]["task_id"]
    wait_status(backend.url, task_id, {"TIMEOUT"}, headers={"X-Tenant-Id": "demo"})

    async def poll_both() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=AUTH, timeout=20) as client:
            return await asyncio.gather(*(client.get(f"{gw.url}{API}/{task_id}")
                                          for _ in range(10) for gw in (first, second)))

    answers = asyncio.run(poll_both())
    assert {r.status_code for r in answers} == {200}
    task = httpx.get(f"{backend.url}/exports/{task_id}", headers=backend_headers("demo")).json()["data"]
    assert task["reruns"] == 1 and task["attempt"] == 2 and task["degraded"] is True
    assert task["timeout_sec"] == 2
    assert all(r.json()["data"]["attempt"] == 2 for r in answers if r.json()["data"]["status"] != "TIMEOUT")
    again = wait_status(first.url, task_id, {"TIMEOUT"}, path=f"{API}/", headers=AUTH)
    assert again["attempt"] == 2 and again["reruns"] == 1, "max_reruns is 1: the second TIMEOUT stays"
