"""One stream's body on the wire: sse-starlette's EventSourceResponse around the subscriber's queue.

sse-starlette sends the keep-alive comments (`heartbeat_sec`), bounds each send
(`send_timeout_sec`: a reader that stops reading is dropped), notices the client leaving,
and ends every stream at once when the server shuts down gracefully, so clients reconnect
(to another gateway) with Last-Event-ID. The body here yields the subscriber's frames and
ends the stream when the subscriber ends: after a per-task stream's terminal event, after
`idle_close_sec` without an event, or when the fan-out drops it. A dropped reader's
connection is closed without the body's last frame, so it cannot mistake the cut for an end.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Awaitable

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus, SendTimeoutError
from starlette.types import Receive, Scope, Send

from gateway.plugins.events.subscriber import SEP, Subscriber

log = logging.getLogger("gateway.events")
# ends the stream abruptly: the client must see a cut, not an end
ABORTS = frozenset({"slow_reader"})


class _Dropped(Exception):
    pass


class EventStream:
    """The body of one open stream (a GatewayResponse's `events`); `finish` runs once when it ends."""

    def __init__(self, sub: Subscriber, retry_ms: int, heartbeat_sec: float, idle_close_sec: float,
                 send_timeout_sec: float, finish: Callable[[str, int], Awaitable[None]]) -> None:
        self.sub = sub
        self.retry_ms = retry_ms
        self.heartbeat_sec = heartbeat_sec
        self.idle_close_sec = idle_close_sec
        self.send_timeout_sec = send_timeout_sec
        self.finish = finish
        # the access log's line, written when the stream ends (dispatch sets it when the log is on)
        self.on_end: Callable[[int], None] | None = None

    async def _frames(self) -> AsyncIterator[bytes]:
        sub = self.sub
        first = ServerSentEvent(retry=self.retry_ms, sep=SEP).encode()
        yield first + sub.take()
        idle_until = time.monotonic() + self.idle_close_sec
        while True:
            if sub.pending:
                yield sub.take()
                idle_until = time.monotonic() + self.idle_close_sec
                continue
            if sub.ended is not None:
                break
            sub.wake.clear()
            try:  # a timeout scope, not wait_for: no task of its own for each waiting stream
                async with asyncio.timeout(idle_until - time.monotonic()):
                    await sub.wake.wait()
            except TimeoutError:
                sub.end("idle")
        if sub.ended in ABORTS:
            raise _Dropped(sub.ended)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, headers: list[tuple[str, str]]) -> None:
        response = EventSourceResponse(
            self._frames(), headers=dict(headers), ping=self.heartbeat_sec, sep=SEP,
            ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=SEP),
            send_timeout=self.send_timeout_sec)
        sub = self.sub
        try:
            await response(scope, receive, send)
        except (_Dropped, SendTimeoutError):
            sub.end("slow_reader")
            log.info("a slow event reader was dropped", extra={"route": sub.route, "tenant": sub.tenant,
                                                               "task_id": sub.task_id})
        finally:
            if sub.ended is None:
                sub.end("shutdown" if AppStatus.should_exit else "client_closed")
            await self.finish(sub.ended or "client_closed", sub.events)
            if self.on_end is not None:
                self.on_end(sub.events)
