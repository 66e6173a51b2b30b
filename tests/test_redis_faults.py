"""Redis faults for real: one test per bug of the scale-out chaos run.

Each test starts its own redis-server (it pauses, kills or empties it) and real
gateway and backend processes; faults are kill -9, SIGSTOP and restarts with
and without the append-only file.
"""
from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import backend_create, backend_task, wait_status
from tests.procs import RedisServer, Service, backend_headers, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
TENANT = backend_headers("demo")
BODY = {"export_type": "report_export"}
# a Redis stall costs a gateway request at most three tries of its 1 s socket timeout plus backoff
STALL_ANSWER_SEC = 8.0


@pytest.fixture
def redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    yield server
    server.stop()


def _claim(redis: RedisServer, key: str) -> dict[str, Any] | None:
    client = redis.client()
    try:
        raw = client.get(f"gw:idem:{{demo}}:submit:{key}")
    finally:
        client.close()
    return json.loads(raw) if raw else None


def _submit_until_id(url: str, key: str, timeout: float = 30.0) -> str:
    """Retry as a client would (same key, after Retry-After) until the submit gets its id."""
    def attempt() -> str | None:
        resp = httpx.post(url + API, json=BODY, headers=AUTH | {"Idempotency-Key": key}, timeout=20)
        assert resp.status_code < 500 or (resp.status_code == 503 and "retry-after" in resp.headers), resp.text
        return resp.json()["data"]["task_id"] if resp.status_code == 202 else None

    return str(wait_until(attempt, timeout, interval=0.5, what=f"key {key} to get its task id"))


def _ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def _post_to_die(url: str, key: str) -> None:
    """A submit whose gateway is killed under it: the client sees only a dropped connection."""
    try:
        httpx.post(url + API, json=BODY, headers=AUTH | {"Idempotency-Key": key}, timeout=30)
    except httpx.HTTPError:
        pass


def _tasks_of_demo(backend: Service) -> list[dict[str, Any]]:
    resp = httpx.get(f"{backend.url}/exports", params={"limit": 100}, headers=TENANT, timeout=10)
    resp.raise_for_status()
    return list(resp.json()["data"]["items"])


def _starts(backend: Service, task_id: str) -> int:
    return sum(1 for line in backend.log().splitlines() if '"task started"' in line and task_id in line)


def test_readyz_answers_503_while_redis_is_unreachable(services: Callable[..., Service], redis_aof: RedisServer,
                                                      tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_aof.url))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, redis_aof.url))
    for svc in (gateway, backend):
        assert httpx.get(f"{svc.url}/readyz").status_code == 200
    redis_aof.pause()
    try:
        for svc in (gateway, backend):
            resp = httpx.get(f"{svc.url}/readyz", timeout=10)
            assert resp.status_code == 503 and resp.headers["retry-after"], resp.text
            assert resp.json()["code"] == 50300
            assert httpx.get(f"{svc.url}/healthz", timeout=5).status_code == 200  # alive all the same
    finally:
        redis_aof.resume()
    redis_aof.kill()
    wait_until(lambda: httpx.get(f"{gateway.url}/readyz", timeout=5).status_code == 503, 10, what="gateway 503")
    wait_until(lambda: httpx.get(f"{backend.url}/readyz", timeout=5).status_code == 503, 10, what="backend 503")
    redis_aof.restart()
    for url in (gateway.url, backend.url):
        wait_until(functools.partial(_ready, url), 15, what=f"{url} ready again")


def test_stall_answers_503_with_retry_after_and_a_restart_no_500(services: Callable[..., Service],
                                                                redis_aof: RedisServer, tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_aof.url))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, redis_aof.url))
    known = _submit_until_id(gateway.url, "before-stall")
    redis_aof.pause()
    try:
        started = time.monotonic()
        submit = httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": "in-stall"}, timeout=30)
        poll = httpx.get(f"{gateway.url}{API}/{known}", headers=AUTH, timeout=30)
        elapsed = time.monotonic() - started
    finally:
        redis_aof.resume()
    for resp in (submit, poll):
        assert resp.status_code == 503, resp.text
        assert int(resp.headers["retry-after"]) >= 1
        assert resp.json()["code"] == 50300
    assert elapsed < 2 * STALL_ANSWER_SEC
    # the stalled claim may have run when Redis woke up: the key still gets exactly one id
    stalled_id = _submit_until_id(gateway.url, "in-stall")
    assert _submit_until_id(gateway.url, "in-stall") == stalled_id

    redis_aof.restart()  # kill -9, back with its append-only file: every pooled connection is now stale
    statuses = []
    for n in range(20):
        statuses.append(httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": f"after-{n}"},
                                   timeout=20).status_code)
        statuses.append(httpx.get(f"{gateway.url}{API}/{known}", headers=AUTH, timeout=20).status_code)
    assert statuses.count(500) == 0 and set(statuses) <= {200, 202}, statuses


def test_claim_of_a_killed_gateway_is_taken_over_with_the_same_task_id(
        services: Callable[..., Service], redis_aof: RedisServer, tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_aof.url))
    doomed = services("gateway", gateway_config(tmp_path, backend.url, redis_aof.url), name="gateway-a")
    other = services("gateway", gateway_config(tmp_path, backend.url, redis_aof.url), name="gateway-b")
    backend.signal(19)  # SIGSTOP: the submit through gateway A hangs after its claim
    try:
        hung = threading.Thread(target=_post_to_die, args=(doomed.url, "killed"), daemon=True)
        hung.start()
        claim = wait_until(lambda: _claim(redis_aof, "killed"), 10, what="gateway A's claim")
        doomed.kill()
    finally:
        backend.signal(18)  # SIGCONT
    assert claim["state"] == "claimed" and claim["token"] == 1
    started = time.monotonic()
    task_id = _submit_until_id(other.url, "killed")
    assert task_id == claim["task_id"]  # the claim's id, re-sent: never a second task
    assert time.monotonic() - started < 15  # the dead owner's lease, not a minute
    assert [t["task_id"] for t in _tasks_of_demo(backend)] == [task_id]
    wait_status(backend.url, task_id, {"COMPLETED"}, headers=TENANT)


def test_record_write_failing_after_the_backend_created_the_task_yields_no_second_task(
        services: Callable[..., Service], tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis", persistent=True, fsync="always").start()
    try:
        backend = services("backend_stub", backend_config(tmp_path))  # its own SQLite store: only the gateway's
        gateway = services("gateway", gateway_config(tmp_path, backend.url, redis.url))  # Redis fails
        answers: list[httpx.Response] = []
        backend.signal(19)
        try:
            first = threading.Thread(target=lambda: answers.append(httpx.post(
                gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": "lost-record"}, timeout=30)))
            first.start()
            claim = wait_until(lambda: _claim(redis, "lost-record"), 10, what="the claim")
            redis.kill()  # the claim is on disk (fsync always); the record of the answer will not be
        finally:
            backend.signal(18)
        first.join(30)
        # the backend created the task: the client gets its id, though the gateway could not record it
        assert answers[0].status_code == 202, answers[0].text
        assert answers[0].json()["data"]["task_id"] == claim["task_id"]
        redis.restart()
        assert _submit_until_id(gateway.url, "lost-record") == claim["task_id"]
        assert [t["task_id"] for t in _tasks_of_demo(backend)] == [claim["task_id"]]
    finally:
        redis.stop()


def test_the_queue_works_again_after_redis_restarts_empty(services: Callable[..., Service],
                                                          tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis").start()
    try:
        backend = services("backend_stub", backend_config(tmp_path, redis.url))
        gateway = services("gateway", gateway_config(tmp_path, backend.url))
        redis.restart(empty=True)
        wait_until(lambda: httpx.get(f"{backend.url}/readyz", timeout=5).status_code == 200, 15, what="ready")
        task_id = _submit_until_id(gateway.url, "after-empty-restart")
        wait_status(backend.url, task_id, {"COMPLETED"}, timeout=30, headers=TENANT)
    finally:
        redis.stop()


def test_stall_shorter_than_the_lease_runs_no_task_twice(services: Callable[..., Service], redis_aof: RedisServer,
                                                         tmp_path: Path) -> None:
    slow = {"stall_export": synthetic_type("orders", 20000, 3, fault={"delay_sec": 8})}
    backend = services("backend_stub", backend_config(tmp_path, redis_aof.url, lease_sec=12, workers=2,
                                                      export_types=slow))
    ids = []
    for n in range(2):
        resp = httpx.post(f"{backend.url}/exports", json={"export_type": "stall_export"},
                          headers=TENANT | {"X-Task-Id": f"exp-20260101-stall{n:011d}aaaaaaaa"}, timeout=10)
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["data"]["task_id"])
    for task_id in ids:
        wait_status(backend.url, task_id, {"RUNNING"}, headers=TENANT)
    redis_aof.pause()
    time.sleep(5)  # the fault itself: longer than the store's socket timeout, shorter than the lease
    redis_aof.resume()
    for task_id in ids:
        done = wait_status(backend.url, task_id, {"COMPLETED", "FAILED"}, timeout=40, headers=TENANT)
        assert done["status"] == "COMPLETED" and done["attempt"] == 1
        assert _starts(backend, task_id) == 1
    assert "retrying within the lease" in backend.log() or "progress not written" in backend.log()


def test_outbox_is_drained_by_the_gateway_that_can_deliver(services: Callable[..., Service],
                                                           redis_aof: RedisServer, tmp_path: Path) -> None:
    b1 = services("backend_stub", backend_config(tmp_path, redis_aof.url), name="backend-1")
    b2 = services("backend_stub", backend_config(tmp_path, redis_aof.url), name="backend-2")
    ga = services("gateway", gateway_config(tmp_path, b1.url, redis_aof.url), name="gateway-a")
    gb = services("gateway", gateway_config(tmp_path, b2.url, redis_aof.url), name="gateway-b")
    b1.kill()
    b2.kill()
    order = []
    for n in range(6):
        gateway = (ga, gb)[n % 2]
        resp = httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": f"outboxed-{n}"},
                          timeout=30)
        assert resp.status_code == 202 and resp.json()["data"]["degraded"] is True, resp.text
        order.append(resp.json()["data"]["task_id"])
    b2.start()  # only gateway B's backend returns; gateway A's stays down
    for task_id in order:
        wait_status(b2.url, task_id, {"COMPLETED"}, timeout=60, headers=TENANT)
    created = [backend_task(b2.url, t, "demo")["created_at"] for t in order]
    assert created == sorted(created)  # delivered in the order the submissions were accepted
    assert b1.proc is not None and b1.proc.poll() is not None


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "sqlite"])
def test_a_tenant_over_its_idempotency_key_cap_gets_429(services: Callable[..., Service], redis_server: RedisServer,
                                                        tmp_path: Path, shared: bool) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    config = gateway_config(tmp_path, backend.url, redis_server.url if shared else "",
                            redis_prefix=f"cap{time.time_ns()}")
    submit = next(r for r in config["routes"] if r["name"] == "submit")
    submit["plugins"] = [{"idempotency": {"ttl_sec": 86400, "max_keys_per_tenant": 2}} if p == "idempotency" or
                         (isinstance(p, dict) and "idempotency" in p) else p for p in submit["plugins"]]
    gateway = services("gateway", config)
    ids = [_submit_until_id(gateway.url, f"cap-{n}") for n in range(2)]
    over = httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": "cap-2"}, timeout=10)
    assert over.status_code == 429 and over.json()["code"] == 42910 and over.headers["retry-after"], over.text
    assert _submit_until_id(gateway.url, "cap-0") == ids[0]  # keys it holds still answer
    plain = httpx.post(gateway.url + API, json=BODY, headers=AUTH, timeout=10)
    assert plain.status_code == 202  # and it can still submit without a key


@pytest.mark.parametrize("plugins, problem", [
    (["auth", {"task_id": {"action": "generate"}}, "idempotency"], "must come before task_id"),
    (["auth", {"idempotency": {"task_id_prefix": "abc"}}, {"task_id": {"action": "generate"}}], "must equal"),
])
def test_route_config_checks_that_idempotency_fixes_the_task_id_first(plugins: list[Any], problem: str) -> None:
    from pydantic import ValidationError

    from gateway.config import RouteConfig

    with pytest.raises(ValidationError, match=problem):
        RouteConfig.model_validate({"name": "submit", "path": "/s", "methods": ["POST"], "upstream": "exports",
                                    "plugins": plugins})



def _log_records(service: Service) -> list[dict[str, Any]]:
    return [json.loads(line) for line in service.log().splitlines() if line.startswith("{")]


def test_background_loops_log_one_warning_while_redis_is_down_and_resume_after(
        services: Callable[..., Service], redis_aof: RedisServer, tmp_path: Path) -> None:
    loops = ("expiry sweep", "callback dispatch", "worker")
    backend = services("backend_stub", backend_config(tmp_path, redis_aof.url, sweep_interval_sec=0.2, workers=1,
                                                      callbacks={"poll_interval_sec": 0.1}))
    redis_aof.kill()

    def warned() -> list[dict[str, Any]]:
        return [r for r in _log_records(backend) if "failed: the task store (Redis) does not answer" in r["msg"]]

    wait_until(lambda: {n for n in loops if any(r["msg"].startswith(n) for r in warned())} == set(loops), 20,
               what="each loop to say Redis is down")
    # the outage goes on for many of the loops' intervals (0.1 s, 0.2 s, 1 s), the backend says not ready
    down_until = time.monotonic() + 2.5
    while time.monotonic() < down_until:
        assert httpx.get(f"{backend.url}/readyz", timeout=5).status_code == 503
    assert len(warned()) == len(loops), "one line per loop, the next only a minute on"
    redis_aof.restart()

    def recovered() -> dict[str, int]:
        return {n: r["failures"] for r in _log_records(backend) for n in loops
                if r["msg"].startswith(n) and r["msg"].endswith("works again")}

    again = wait_until(lambda: (found := recovered()).keys() == set(loops) and found, 20,
                       what="every loop to work again")
    assert again["expiry sweep"] >= 5 and again["callback dispatch"] >= 10 and again["worker"] >= 2, again
    created = backend_create(backend.url, BODY, tenant="demo")
    assert created.status_code == 201, created.text
    assert wait_status(backend.url, created.json()["data"]["task_id"], headers=TENANT)["status"] == "COMPLETED"
    assert "Traceback" not in backend.log()
