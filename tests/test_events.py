"""Task status as server-sent events, on one gateway and one backend: the wire format byte by byte, the TIMEOUT
re-run on the stream, resuming, tenant isolation, the tenant stream, heartbeats and idle close, metrics and the
access log, and the SDK's wait on a stream (and polling where a gateway serves none)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from exports_client import ExportsClient, NotFound
from tests.conftest import DEMO2_KEY, DEMO_KEY, backend_config, gateway_config
from tests.procs import Service, wait_until
from tests.sse_client import RawStream

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
AUTH2 = {"Authorization": f"Bearer {DEMO2_KEY}"}
TYPES = {
    "blocker_export": {"dataset": "orders", "rows": 2000, "seed": 1, "fault": {"delay_sec": 2}},
    "timeout_export": {"dataset": "orders", "rows": 2000, "seed": 2, "fault": {"delay_sec": 3}},
}


def _route(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in config["routes"] if r["name"] == name)


def _events_settings(route: dict[str, Any]) -> dict[str, Any]:
    return next(p["events"] for p in route["plugins"] if isinstance(p, dict) and "events" in p)


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Service, Service, Service]]:
    workdir = tmp_path_factory.mktemp("events")
    config = backend_config(workdir, workers=1)
    config["export_types"].update(TYPES)
    backend = module_services("backend_stub", config)
    gw = gateway_config(workdir, backend.url, access_log=True)
    _events_settings(_route(gw, "events")).update(heartbeat_sec=1, idle_close_sec=3)
    gateway = module_services("gateway", gw, name="gateway")
    # a gateway without the event routes (an older one): the SDK polls there
    older = gateway_config(workdir, backend.url)
    older["routes"] = [r for r in older["routes"] if r["name"] not in ("task_events", "events")]
    yield backend, gateway, module_services("gateway", older, name="older")


def submit(gateway: Service, export_type: str = "report_export", auth: dict[str, str] = AUTH,
           **body: Any) -> dict[str, Any]:
    resp = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": export_type, **body}, headers=auth)
    assert resp.status_code == 202, resp.text
    data: dict[str, Any] = resp.json()["data"]
    return data


def events_path(task_id: str) -> str:
    return f"/api/v1/exports/{task_id}/events"


def test_a_task_is_followed_from_pending_to_completed_and_each_event_is_exact_to_the_byte(
        stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    submit(gateway, "blocker_export")  # the one worker is busy: the next task waits, PENDING
    task = submit(gateway)
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as stream:
        assert stream.status == 200
        assert stream.headers["content-type"] == "text/event-stream"
        assert stream.headers["cache-control"] == "no-cache" and stream.headers["x-accel-buffering"] == "no"
        stream.read_to_end()
    assert stream.ended and not stream.cut, "the stream ends cleanly after the terminal event"
    assert stream.body.startswith(b"retry: 3000\n\n")
    events = stream.events
    assert events[0].task["status"] == "PENDING" and events[-1].task["status"] == "COMPLETED"
    assert [e.task["status"] for e in events].count("COMPLETED") == 1
    progress = [e.task["progress"] for e in events]
    assert progress == sorted(progress) and progress[-1] == 100
    ids = [e.fields["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for event in events:
        # exactly what the status route answers, compact JSON on one data line, the change id as the event id
        envelope = json.loads(event.fields["data"])
        assert envelope["code"] == 0 and envelope["message"] == "success"
        assert event.raw == (f"id: {envelope['data']['change_id']}\nevent: status\n"
                             f"data: {json.dumps(envelope, separators=(',', ':'))}\n\n").encode()
    # nothing but the retry field, comments and the events: the body is their concatenation
    rest = stream.body[len(b"retry: 3000\n\n"):]
    assert re.sub(rb"(: keep-alive\n\n)", b"", rest) == b"".join(e.raw for e in events)
    final = events[-1].task
    polled = httpx.get(f"{gateway.url}/api/v1/exports/{task['task_id']}", headers=AUTH).json()["data"]
    assert final == polled, "the last event is what the status route answers"
    assert final["result"]["download_url"].startswith(f"{gateway.url}/api/v1/exports/{task['task_id']}/download?")


def test_a_streamed_timeout_is_rerun_once_and_completes_on_the_same_stream_with_a_link_that_downloads(
        stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    task = submit(gateway, "timeout_export", timeout_sec=1)
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as stream:
        stream.read_to_end(timeout=30)
    statuses = [(e.task["status"], e.task["attempt"]) for e in stream.events]
    assert ("TIMEOUT", 1) not in statuses, "a TIMEOUT the route re-runs is re-run before the event"
    assert statuses[-1] == ("COMPLETED", 2), statuses
    final = stream.events[-1].task
    assert final["degraded"] is True and final["reruns"] == 1
    file = httpx.get(final["result"]["download_url"])
    assert file.status_code == 200 and len(file.content) == final["result"]["bytes"]


def test_last_event_id_resumes_after_a_cut(stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    submit(gateway, "blocker_export")
    task = submit(gateway)
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as first:
        first.read_until(lambda s: len(s.events) >= 1)
    seen = first.events[0].fields["id"]
    with RawStream(gateway.url, events_path(task["task_id"]), {**AUTH, "Last-Event-ID": seen}) as resumed:
        resumed.read_to_end()
    assert resumed.events and all(e.fields["id"] > seen for e in resumed.events), "nothing seen is sent again"
    assert resumed.events[-1].task["status"] == "COMPLETED"
    last = resumed.events[-1].fields["id"]
    # the client has the final state already: the stream has nothing to send and ends
    with RawStream(gateway.url, events_path(task["task_id"]), {**AUTH, "Last-Event-ID": last}) as done:
        done.read_to_end(timeout=5)
    assert done.ended and done.events == []
    # an id this log never issued gets the current state
    with RawStream(gateway.url, events_path(task["task_id"]), {**AUTH, "Last-Event-ID": "not-an-id"}) as fresh:
        fresh.read_to_end(timeout=5)
    assert [e.task["status"] for e in fresh.events] == ["COMPLETED"]


def test_another_tenants_task_is_404_and_a_stream_without_a_key_is_401(stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    submit(gateway, "blocker_export")
    task = submit(gateway)
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as mine:
        mine.read_until(lambda s: bool(s.events))
        # while the owner watches it (its state held by the gateway), another tenant still learns nothing
        other = httpx.get(f"{gateway.url}{events_path(task['task_id'])}", headers=AUTH2)
        assert other.status_code == 404 and other.json()["code"] == 40401
        mine.read_to_end()
    assert mine.events[-1].task["status"] == "COMPLETED", "the owner's stream is not disturbed"
    assert httpx.get(f"{gateway.url}{events_path('exp-20260101-nosuchtask0000000')}",
                     headers=AUTH).json()["code"] == 40401
    for url in (f"{gateway.url}{events_path(task['task_id'])}", f"{gateway.url}/api/v1/events"):
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, params={"api_key": DEMO_KEY}).status_code == 401, "keys never in the query string"


def test_the_tenant_stream_carries_all_of_a_tenants_tasks_and_none_of_anothers(
        stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    running = submit(gateway, "blocker_export")
    with RawStream(gateway.url, "/api/v1/events", AUTH) as stream:
        stream.read_until(lambda s: bool(s.events))
        assert stream.events[0].task["task_id"] == running["task_id"], "starts with the non-terminal tasks"
        mine = [submit(gateway)["task_id"], submit(gateway, "user_export")["task_id"]]
        theirs = submit(gateway, auth=AUTH2)["task_id"]

        def all_done(s: RawStream) -> bool:
            done = {e.task["task_id"] for e in s.events if e.task["status"] == "COMPLETED"}
            return set(mine) <= done

        stream.read_until(all_done, timeout=30)
    ids = {e.task["task_id"] for e in stream.events}
    assert set(mine) | {running["task_id"]} <= ids and theirs not in ids


def test_a_quiet_stream_gets_heartbeats_and_is_closed_when_idle(stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    started = time.monotonic()
    with RawStream(gateway.url, "/api/v1/events", AUTH2) as stream:
        stream.read_to_end(timeout=10)
    assert stream.ended and not stream.cut
    assert 3 <= time.monotonic() - started < 8
    assert stream.body.count(b": keep-alive\n\n") >= 2


def test_streams_are_counted_and_logged_when_they_end(stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    task = submit(gateway)
    with RawStream(gateway.url, events_path(task["task_id"]), AUTH) as stream:
        stream.read_to_end()
        metrics = httpx.get(f"{gateway.url}/metrics").text
    assert re.search(r'gateway_event_streams_total\{outcome="terminal",route="task_events"\} [1-9]', metrics)
    assert re.search(r'gateway_events_sent_total\{route="task_events"\} [1-9]', metrics)
    assert 'gateway_event_streams_total{outcome="slow_reader",route="task_events"} 0.0' in metrics
    assert "gateway_event_streams_open" in metrics
    lines = wait_until(lambda: [json.loads(line) for line in gateway.log().splitlines()
                                if task["task_id"] in line and '"route": "task_events"' in line],
                       what="the stream's access log line")
    [line] = lines
    assert line["events"] == len(stream.events) and line["status"] == 200 and line["duration_ms"] > 0


class Requests(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.method} {request.url.path}")
        return super().handle_request(request)


def test_the_sdks_wait_opens_one_stream_and_makes_no_polls(stack: tuple[Service, Service, Service]) -> None:
    _, gateway, _ = stack
    requests = Requests()
    seen: list[str] = []
    with ExportsClient(gateway.url, DEMO_KEY, transport=requests) as client:
        task = client.submit("order_export")
        final = client.wait(task.task_id, on_progress=lambda t: seen.append(t.status))
        assert final.status == "COMPLETED" and seen
        assert requests.paths == ["POST /api/v1/exports", f"GET /api/v1/exports/{task.task_id}/events"]
        with pytest.raises(NotFound):
            client.wait("exp-20260101-nosuchtask0000000")
        watched = list(client.watch(task.task_id))
        assert [t.status for t in watched] == ["COMPLETED"]


def test_the_sdk_polls_where_the_gateway_serves_no_streams(stack: tuple[Service, Service, Service],
                                                           tmp_path: Path) -> None:
    _, _, older = stack
    requests = Requests()
    with ExportsClient(older.url, DEMO_KEY, transport=requests) as client:
        task = client.submit("report_export")
        assert client.wait(task.task_id).status == "COMPLETED"
    assert requests.paths[1] == f"GET /api/v1/exports/{task.task_id}/events"
    assert requests.paths.count(f"GET /api/v1/exports/{task.task_id}") >= 1, "polled after the 404"
