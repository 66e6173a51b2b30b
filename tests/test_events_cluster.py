"""Event streams on two gateways sharing a Redis and a backend: a change reaches watchers on either gateway,
Last-Event-ID resumes on the other one, the per-tenant cap holds across both, the SDK rides out a gateway
restart, and with Redis gone streams end cleanly and new ones are refused at once instead of hanging."""
from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import pytest

from exports_client import ExportsClient, Task
from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.procs import RedisServer, Service, wait_until
from tests.sse_client import RawStream
from tests.test_events import AUTH, AUTH2, Requests, _events_settings, _route, events_path, submit

CAP = 2


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()  # its own: one test kills it
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(module_services: Callable[..., Service], redis: RedisServer,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[Service, Service, Service]:
    workdir = tmp_path_factory.mktemp("cluster")
    config = backend_config(workdir, redis.url, workers=2, redis_prefix="ev-cluster")
    config["export_types"]["six_export"] = {"dataset": "orders", "rows": 2000, "seed": 3, "fault": {"delay_sec": 6}}
    backend = module_services("backend_stub", config)

    def gateway(name: str) -> Service:
        gw = gateway_config(workdir, backend.url, redis.url, gateway_processes=2, redis_prefix="ev-gw")
        for route in ("task_events", "events"):
            _events_settings(_route(gw, route)).update(retry_ms=500, upstream_down_close_sec=3, open_wait_sec=1)
        return module_services("gateway", gw, name=name, TENANT_MAX_OPEN_STREAMS=str(CAP))

    return backend, gateway("gateway-a"), gateway("gateway-b")


def test_a_watcher_on_gateway_b_sees_a_task_submitted_through_gateway_a(
        cluster: tuple[Service, Service, Service]) -> None:
    _, a, b = cluster
    task = submit(a)
    with RawStream(b.url, events_path(task["task_id"]), AUTH) as stream:
        stream.read_to_end()
    assert stream.ended and stream.events[-1].task["status"] == "COMPLETED"
    assert stream.events[-1].task["result"]["download_url"].startswith(b.config["public_base_url"])


def test_last_event_id_resumes_on_the_other_gateway(cluster: tuple[Service, Service, Service]) -> None:
    _, a, b = cluster
    task = submit(a, "six_export")
    with RawStream(a.url, events_path(task["task_id"]), AUTH) as first:
        first.read_until(lambda s: bool(s.events))
    seen = first.events[-1].fields["id"]
    with RawStream(b.url, events_path(task["task_id"]), {**AUTH, "Last-Event-ID": seen}) as resumed:
        resumed.read_until(lambda s: bool(s.events), timeout=15)
    assert resumed.events[0].fields["id"] > seen, "resumed after the last event seen, on the other gateway"
    httpx.post(f"{a.url}/api/v1/exports/{task['task_id']}/cancel", headers=AUTH)


def test_the_per_tenant_cap_on_open_streams_holds_across_gateways(cluster: tuple[Service, Service, Service]) -> None:
    _, a, b = cluster
    with RawStream(a.url, "/api/v1/events", AUTH) as one, RawStream(b.url, "/api/v1/events", AUTH) as two:
        assert one.status == two.status == 200
        refused = httpx.get(f"{a.url}/api/v1/events", headers=AUTH)
        assert refused.status_code == 429 and refused.json()["code"] == 42903
        assert refused.headers["retry-after"].isdigit()
        assert refused.headers["ratelimit-policy"] == f'"streams";q={CAP}'
        assert refused.headers["ratelimit"].startswith('"streams";r=0;t=')
        with RawStream(a.url, "/api/v1/events", AUTH2) as other:
            assert other.status == 200, "another tenant's streams do not count"

    def reopened() -> RawStream | None:
        stream = RawStream(b.url, "/api/v1/events", AUTH)
        if stream.status == 200:
            return stream
        stream.close()
        return None

    again = wait_until(reopened, timeout=10, what="a closed stream to give its place back")
    again.close()


def test_the_sdk_resumes_through_a_gateway_restart_and_reaches_completed(
        cluster: tuple[Service, Service, Service]) -> None:
    _, _, b = cluster
    requests = Requests()
    states: list[Task] = []
    outcome: dict[str, Any] = {}
    # retries: the gateway may take a while to come back on a loaded machine; the SDK keeps trying meanwhile
    with ExportsClient(b.url, DEMO_KEY, transport=requests, retries=8) as client:
        task = client.submit("six_export")

        def follow() -> None:
            outcome["task"] = client.wait(task.task_id, max_wait=60, on_progress=states.append)

        waiter = threading.Thread(target=follow)
        waiter.start()
        wait_until(lambda: states, what="the first event")
        stopping = time.monotonic()
        b.signal(signal.SIGTERM)
        assert b.proc is not None
        b.proc.wait(10)
        assert time.monotonic() - stopping < 3, "a graceful shutdown ends event streams at once"
        b.start()
        waiter.join(60)
    assert outcome["task"].status == "COMPLETED"
    opens = [p for p in requests.paths if p.endswith("/events")]
    assert len(opens) >= 2, requests.paths


def test_with_redis_down_streams_end_cleanly_and_new_ones_are_refused_at_once(
        cluster: tuple[Service, Service, Service], redis: RedisServer) -> None:
    _, a, _ = cluster
    task = submit(a, "six_export")
    with RawStream(a.url, events_path(task["task_id"]), AUTH) as stream:
        stream.read_until(lambda s: bool(s.events))
        redis.kill()
        started = time.monotonic()
        stream.read_to_end(timeout=20)
        assert stream.ended and not stream.cut, "ended with the body's last chunk"
        assert time.monotonic() - started < 15
    started = time.monotonic()
    refused = httpx.get(f"{a.url}{events_path(task['task_id'])}", headers=AUTH, timeout=10)
    assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
    assert time.monotonic() - started < 5
    redis.start()
    fresh = wait_until(lambda: httpx.post(f"{a.url}/api/v1/exports", json={"export_type": "report_export"},
                                          headers=AUTH).json()["data"], timeout=30, what="a submit with Redis back")

    def reopened() -> RawStream | None:  # as a client would: again after the Retry-After, until it opens
        stream = RawStream(a.url, events_path(fresh["task_id"]), AUTH)
        if stream.status == 200:
            return stream
        stream.close()
        return None

    with wait_until(reopened, timeout=20, interval=0.5, what="a stream with Redis back") as back:
        back.read_to_end(timeout=30)
    assert back.events[-1].task["status"] == "COMPLETED"

