"""Attacks on the SDK's `wait` by an event stream that misbehaves (a broken proxy, a hostile server): a line
that never ends, an event that never ends, status events that are not tasks, a trickle that never completes
an event, an id no header can carry. The SDK gives such a stream up within its retries and polls, in bounded
memory and time (an id it cannot send back is not sent); `max_wait` holds however the server trickles; the
caller never sees the parser's own errors."""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import httpx
import pytest

from exports_client import ExportsClient, WaitTimeout
from exports_client.aio import AsyncExportsClient
from exports_client.sse import MAX_LINE_BYTES, BrokenStream, LineSplitter
from tests.procs import free_port, stand_in, uvicorn_command

TASK_ID = "exp-20260101-aaaaaaaaaaaaaaaaaaaa"
RETRIES = 1


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[str]:
    port = free_port()
    with stand_in(uvicorn_command("tests.hostile_event_stream:app", port), port, "the hostile stream",
                  ready_path="/stats", env={**os.environ, "STREAM": request.param}) as url:
        yield url


def counts(url: str) -> dict[str, int]:
    return dict(httpx.get(f"{url}/stats", timeout=5).json())


@pytest.mark.parametrize("hostile", ["endless_line", "endless_event", "garbage_data"], indirect=True)
def test_a_broken_stream_is_given_up_within_the_retries_and_the_wait_ends_by_polling(hostile: str) -> None:
    started = time.monotonic()
    task = ExportsClient(hostile, "key", retries=RETRIES).wait(TASK_ID, max_wait=8)
    assert task.status == "COMPLETED" and time.monotonic() - started < 5
    seen = counts(hostile)
    assert seen["streams"] <= RETRIES + 2 and seen["polls"] >= 1, seen


@pytest.mark.parametrize("hostile", ["endless_line", "garbage_data"], indirect=True)
def test_the_async_client_gives_a_broken_stream_up_the_same_way(hostile: str) -> None:
    async def wait() -> str:
        async with AsyncExportsClient(hostile, "key", retries=RETRIES) as client:
            return (await client.wait(TASK_ID, max_wait=8)).status

    assert asyncio.run(wait()) == "COMPLETED"
    seen = counts(hostile)
    assert seen["streams"] <= RETRIES + 2 and seen["polls"] >= 1, seen


@pytest.mark.parametrize("hostile", ["trickle"], indirect=True)
def test_max_wait_holds_against_a_stream_that_trickles_and_never_ends_an_event(hostile: str) -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout):
        ExportsClient(hostile, "key", retries=RETRIES).wait(TASK_ID, max_wait=1.5)
    assert time.monotonic() - started < 3.5


@pytest.mark.parametrize("hostile", ["odd_id"], indirect=True)
def test_an_event_id_no_header_can_carry_is_not_sent_back_and_the_wait_goes_on(hostile: str) -> None:
    with pytest.raises(WaitTimeout):  # every stream says RUNNING, then ends: reconnected until max_wait
        ExportsClient(hostile, "key", retries=RETRIES).wait(TASK_ID, max_wait=1.5)
    assert counts(hostile)["streams"] >= 2


def test_lines_end_at_crlf_lf_or_cr_across_chunks_and_a_line_past_the_bound_breaks_the_stream() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\ndata: b\rdata: c\n\n") == ["data: a", "data: b", "data: c", ""]
    with pytest.raises(BrokenStream):
        for _ in range(MAX_LINE_BYTES // 65_536 + 2):
            splitter.feed(b"x" * 65_536)
