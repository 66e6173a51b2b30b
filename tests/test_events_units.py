"""The pieces of event streams that need no server: the SDK's SSE parser, a subscriber's filter and bound,
and the status route's answer view (its gatekeepers left out, a held state answered without an upstream call)."""
from __future__ import annotations

from typing import Any

import pytest

from exports_client import sse
from gateway.context import RequestContext, first_values
from gateway.plugins.events.subscriber import Rendered, Subscriber, newer
from gateway.runtime import RouteViews
from gateway.testing import PluginHarness, _request

pytestmark = pytest.mark.inprocess


def parse(text: str) -> list[sse.Event | sse.Heartbeat]:
    parser = sse.EventParser()
    found = [parser.feed(line) for line in text.split("\n")]
    return [item for item in found if item is not None]


def test_the_sse_parser_follows_the_standard() -> None:
    items = parse("retry: 2500\n\n: keep-alive\n\nid: 7\nevent: status\ndata: {\"a\":\ndata: 1}\n\n"
                  "data:no space\nfoo: ignored\n\nid\ndata: x\n\n")
    assert items[0] is sse.HEARTBEAT
    first, second, third = items[1:]
    assert isinstance(first, sse.Event) and first.event == "status" and first.data == '{"a":\n1}'
    assert first.id == "7" and first.retry_ms == 2500
    assert isinstance(second, sse.Event) and second.event == "message" and second.data == "no space"
    assert second.id == "7", "the last event id carries over"
    assert isinstance(third, sse.Event) and third.id == "", "an empty id resets it"


def rendered(task_id: str, change: str | None, status: str, progress: int, size: int = 10) -> Rendered:
    return Rendered(task_id, change, (status, progress, None, 1), status in ("COMPLETED", "FAILED"),
                    b"x" * size)


def subscriber(task_id: str | None = "t1", max_buffered: int = 1000) -> Subscriber:
    return Subscriber("demo", task_id, "task_events", None, None, "", max_buffered)  # type: ignore[arg-type]


def test_a_subscriber_sends_news_only_in_log_order_and_ends_after_the_terminal_event() -> None:
    sub = subscriber()
    sub.offer(rendered("t1", "002", "RUNNING", 10))  # arrives while the opening state is read
    sub.offer(rendered("t1", "001", "RUNNING", 5))
    sub.open([rendered("t1", "002", "RUNNING", 10)], None)
    assert sub.events == 1, "the opening state only: what arrived meanwhile is not news"
    sub.offer(rendered("t1", "003", "RUNNING", 10))  # a change of something else (the callback): no event
    sub.offer(rendered("t1", "004", "RUNNING", 50))
    sub.offer(rendered("t1", "005", "COMPLETED", 100))
    assert sub.events == 3 and sub.ended == "terminal"
    sub.offer(rendered("t1", "006", "COMPLETED", 100))
    assert sub.events == 3


def test_a_resumed_subscriber_skips_what_the_client_has() -> None:
    sub = subscriber()
    sub.open([rendered("t1", "005", "RUNNING", 50)], "005")
    assert sub.events == 0 and sub.ended is None
    done = subscriber()
    done.open([rendered("t1", "009", "COMPLETED", 100)], "009")
    assert done.ended == "terminal" and done.events == 0
    assert newer("010", "009") and not newer("009", "009") and newer("1", "009"), "another log's id: news"


def test_a_slow_reader_is_dropped_once_its_buffer_passes_the_bound() -> None:
    sub = subscriber(task_id=None, max_buffered=100)
    sub.open([], None)
    for i in range(9):
        sub.offer(rendered(f"t{i}", f"{i:03d}", "RUNNING", i, size=10))
    assert sub.ended is None and sub.buffered == 90
    assert sub.take() == b"x" * 90 and sub.buffered == 0
    for i in range(11):
        sub.offer(rendered(f"u{i}", f"{100 + i:03d}", "RUNNING", i, size=10))
    assert sub.ended == "slow_reader"
    sub.offer(rendered("v", "999", "RUNNING", 1))
    assert sub.buffered == 110, "nothing more is queued for a dropped reader"


async def test_the_status_views_plugins_shape_a_held_state_and_its_gatekeepers_stay_out() -> None:
    plugins: list[Any] = [{"rate_limit": {"limit": "requests"}}, "auth", {"task_id": {"action": "check"}},
                          {"signed_download": {"action": "sign"}}]
    task_id = "exp-20260101-abcdefghijklmnop"
    async with PluginHarness(plugins, tenants={"acme": "key-a"}) as gw:
        view = RouteViews(gw.runtime.config, gw.services).get("test")
        # no Authorization header: auth, had it run, would refuse it
        request = _request("GET", f"/test/{task_id}", {}, b"", "127.0.0.1")
        origin = RequestContext(request.scope, request.receive, first_values(request.scope), "GET", "test",
                                "upstream", "/", {"rest": task_id}, "request-1", tenant="acme")
        held = {"task_id": task_id, "status": "COMPLETED",
                "result": {"download_url": "/x", "expire_at": "2030-01-01T00:00:00Z"}}
        answer = await view.answer(origin, task_id, held)
        assert answer.status == 200
        data = (await answer.json())["data"]
        assert data["result"]["download_url"].startswith(f"http://gateway.test/api/v1/exports/{task_id}/download?")
        assert gw.services.metrics.upstream_calls.total() == 0, "a held state is answered without an upstream call"
