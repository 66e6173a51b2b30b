"""One stream's body on the wire: the subscriber's frames, keep-alive comments, and the ways a stream ends.

The body is Starlette's StreamingResponse fed by an async generator of chunks (the frames
and comments); the product adds a bound on each send and the ways a stream ends. Not
sse-starlette's EventSourceResponse: it runs four anyio tasks per stream (the body, its
ping, a disconnect listener, a shutdown watcher), half of an open stream's memory in the
gateway; StreamingResponse runs the body and a disconnect listener (benchmarks/bench_sse_wire.py).

- `retry:` goes first, with whatever is already queued (the opening state).
- A comment line goes out after `heartbeat_sec` without a frame, so proxies keep it open.
- It ends cleanly (the body's last chunk) after a per-task stream's terminal event, after
  `idle_close_sec` without an event, and when the fan-out ends it: upstream down, resync,
  and at once when the process begins a graceful shutdown (exports_common/shutdown.py), so
  clients resume, with Last-Event-ID, on whichever gateway answers.
- A reader that falls more than `max_buffered_bytes` behind (the subscriber's bound) or
  takes nothing for `send_timeout_sec` is dropped: its connection is cut without the last
  chunk (the body returns unfinished and the server closes the connection, logging no
  traceback), so it cannot mistake the cut for an end.
- A client that leaves ends it (`client_closed`); HEAD sends the headers only.
- `finish` runs once, with why it ended and the events sent; then `on_end` (the access log's line).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Awaitable

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from exports_common import shutdown
from gateway.plugins.events.subscriber import SEP, Subscriber

log = logging.getLogger("gateway.events")
HEARTBEAT = f": keep-alive{SEP}{SEP}".encode()
# ends the stream abruptly: the client must see a cut, not an end
ABORTS = frozenset({"slow_reader"})


class Dropped(Exception):
    """The reader is dropped: the body stops without its last chunk."""


class EventStream:
    """The body of one open stream (a GatewayResponse's `events`); `finish` runs once when it ends."""

    def __init__(self, sub: Subscriber, retry_ms: int, heartbeat_sec: float, idle_close_sec: float,
                 send_timeout_sec: float, finish: Callable[[str, int], Awaitable[None]]) -> None:
        self.sub = sub
        self.retry = f"retry: {retry_ms}{SEP}{SEP}".encode()
        self.heartbeat_sec = heartbeat_sec
        self.idle_close_sec = idle_close_sec
        self.send_timeout_sec = send_timeout_sec
        self.finish = finish
        # the access log's line, written when the stream ends (dispatch sets it when the log is on)
        self.on_end: Callable[[int], None] | None = None

    async def _send(self, send: Send, message: Message) -> None:
        async with asyncio.timeout(self.send_timeout_sec):
            await send(message)

    async def _chunks(self, head_only: bool) -> AsyncIterator[bytes]:
        """Frames as they come, and comments between them, until the subscriber ends; Dropped for a cut."""
        sub = self.sub
        if not head_only:
            yield self.retry + sub.take()
            now = time.monotonic()
            idle_until, beat_at = now + self.idle_close_sec, now + self.heartbeat_sec
            while True:
                if sub.pending:
                    yield sub.take()
                    now = time.monotonic()
                    idle_until, beat_at = now + self.idle_close_sec, now + self.heartbeat_sec
                    continue
                if sub.ended is not None:
                    break
                sub.wake.clear()
                try:  # a timeout scope, not wait_for: no task of its own for each waiting stream
                    async with asyncio.timeout(min(idle_until, beat_at) - time.monotonic()):
                        await sub.wake.wait()
                except TimeoutError:
                    now = time.monotonic()
                    if now >= idle_until:
                        sub.end("idle")
                    elif now >= beat_at:
                        yield HEARTBEAT
                        beat_at = now + self.heartbeat_sec
        if sub.ended in ABORTS:
            raise Dropped

    async def __call__(self, scope: Scope, receive: Receive, send: Send, headers: list[tuple[str, str]]) -> None:
        sub = self.sub
        if shutdown.begun():
            sub.end("shutdown")
        body = StreamingResponse(self._chunks(scope.get("method") == "HEAD"))
        body.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        try:
            # it listens for the client's leaving itself and then stops the body (client_closed, below)
            await body(scope, receive, partial(self._send, send))
        except Dropped:  # returning unfinished: the server closes the connection, the client sees a cut
            log.info("a slow event reader was dropped", extra={"route": sub.route, "tenant": sub.tenant,
                                                               "task_id": sub.task_id})
        except TimeoutError:  # a send the reader did not take in time
            sub.end("slow_reader")
        finally:
            sub.end("client_closed")  # a no-op unless something else ended it first (else: the client left)
            await self.finish(sub.ended or "client_closed", sub.events)
            if self.on_end is not None:
                self.on_end(sub.events)
