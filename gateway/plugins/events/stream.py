"""One stream's body on the wire: the subscriber's frames, keep-alive comments, and the ways a stream ends.

Written here rather than through a library's response: a stream is its own request's task
plus one that waits for the client to leave. sse-starlette's EventSourceResponse runs four
anyio tasks per stream (the body, its ping, a disconnect listener, a shutdown watcher), and
Starlette's StreamingResponse, under uvicorn (ASGI spec 2.3), an anyio task group with the body
in a task of its own beside a disconnect listener; an open stream is multiplied by thousands,
and both hold more memory per stream (docs/libraries.md has the figures and their commands).

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
from collections.abc import Callable
from typing import Awaitable

from starlette.types import Message, Receive, Scope, Send

from exports_common import shutdown
from gateway.plugins.events.subscriber import SEP, Subscriber
from gateway.response import disconnected

log = logging.getLogger("gateway.events")
HEARTBEAT = f": keep-alive{SEP}{SEP}".encode()
# ends the stream abruptly: the client must see a cut, not an end
ABORTS = frozenset({"slow_reader"})


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

    async def _frames(self, send: Send) -> None:
        """Send frames as they come, and comments between them, until the subscriber ends."""
        sub = self.sub
        await self._send(send, {"type": "http.response.body", "body": self.retry + sub.take(), "more_body": True})
        now = time.monotonic()
        idle_until, beat_at = now + self.idle_close_sec, now + self.heartbeat_sec
        while True:
            if sub.pending:
                await self._send(send, {"type": "http.response.body", "body": sub.take(), "more_body": True})
                now = time.monotonic()
                idle_until, beat_at = now + self.idle_close_sec, now + self.heartbeat_sec
                continue
            if sub.ended is not None:
                return
            sub.wake.clear()
            try:  # a timeout scope, not wait_for: no task of its own for each waiting stream
                async with asyncio.timeout(min(idle_until, beat_at) - time.monotonic()):
                    await sub.wake.wait()
            except TimeoutError:
                now = time.monotonic()
                if now >= idle_until:
                    sub.end("idle")
                elif now >= beat_at:
                    await self._send(send, {"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
                    beat_at = now + self.heartbeat_sec

    def _left(self, gone: asyncio.Future[bool]) -> None:
        if not gone.cancelled() and gone.result():
            self.sub.end("client_closed")

    async def __call__(self, scope: Scope, receive: Receive, send: Send, headers: list[tuple[str, str]]) -> None:
        sub = self.sub
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        gone = asyncio.ensure_future(disconnected(receive))
        gone.add_done_callback(self._left)
        if shutdown.begun():
            sub.end("shutdown")
        try:
            await self._send(send, {"type": "http.response.start", "status": 200, "headers": raw})
            if scope.get("method") != "HEAD":
                await self._frames(send)
            if sub.ended in ABORTS:
                log.info("a slow event reader was dropped", extra={"route": sub.route, "tenant": sub.tenant,
                                                                   "task_id": sub.task_id})
                return  # without the last chunk: the server closes the connection, the client sees a cut
            if sub.ended != "client_closed":
                await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:  # a send the reader did not take in time
            sub.end("slow_reader")
        finally:
            gone.cancel()
            sub.end("client_closed")  # a no-op unless nothing else ended it (the request was cancelled)
            await self.finish(sub.ended or "client_closed", sub.events)
            if self.on_end is not None:
                self.on_end(sub.events)
