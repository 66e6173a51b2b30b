"""One open stream as the fan-out sees it: what it follows, what waits to be sent to it, and why it ends.

Events are rendered once per change and shared (`Rendered`: the frame's bytes, the same
object for every watcher); a subscriber only decides whether a rendered event is news
to it (a later change id, and a change of status, progress, current_step or attempt)
and queues its frame. Its queue is bounded in bytes: a reader that falls that far behind
is dropped (it resumes later with Last-Event-ID), so no reader holds memory without limit.
"""
from __future__ import annotations

import asyncio
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from exports_common.contract import TERMINAL
from gateway.answer_view import AnswerView
from gateway.context import RequestContext
from gateway.response import GatewayResponse

# a tenant stream remembers the last state sent of at most this many tasks (forgetting one costs a repeat)
REMEMBERED_TASKS = 10_000
# events that arrive while a stream's opening state is fetched; more means the reader cannot keep up
EARLY_EVENTS = 1_000
SEP = "\n"

# a change id, and a Last-Event-ID worth reading: printable ASCII, no spaces, bounded
EVENT_ID = re.compile(r"[!-~]{1,128}")
Key = tuple[Any, ...]
Group = tuple[str, int, str]


@dataclass(frozen=True, slots=True)
class Rendered:
    """One task state as the status route answers it, framed as an SSE event once for every watcher."""

    task_id: str
    event_id: str | None  # the change id; None when the upstream keeps no change log (no `id:` line then)
    key: Key  # what makes a state news: status, progress, current_step, attempt
    terminal: bool
    frame: bytes


async def render(resp: GatewayResponse) -> Rendered | None:
    """The event for a status answer; None unless it is a 200 holding a task."""
    if resp.status != 200:
        resp.close()
        return None
    body = await resp.read()
    doc = await resp.json()
    task = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(task, dict) or not isinstance(task.get("task_id"), str):
        return None
    change = task.get("change_id")
    # an id that could break the framing (an upstream's own) is left out, as for an upstream without a log
    event_id = change if isinstance(change, str) and EVENT_ID.fullmatch(change) else None
    # the envelope is compact JSON on one line (a newline inside a JSON string is escaped)
    head = f"id: {event_id}{SEP}event: status{SEP}data: " if event_id is not None else f"event: status{SEP}data: "
    frame = head.encode() + body + f"{SEP}{SEP}".encode()
    key = (task.get("status"), task.get("progress"), task.get("current_step"), task.get("attempt"))
    return Rendered(task["task_id"], event_id, key, task.get("status") in TERMINAL, frame)


def newer(event_id: str | None, than: str | None) -> bool:
    """Whether change `event_id` comes after `than` (ids of one log have one width and compare as strings)."""
    if event_id is None or than is None or len(event_id) != len(than):
        return True
    return event_id > than


@dataclass(eq=False)
class Subscriber:
    tenant: str
    task_id: str | None  # None: every task of the tenant
    route: str
    view: AnswerView
    origin: RequestContext  # the stream's request: the view asks on its behalf
    link_base: str  # the base of the links its events carry (one rendering per base)
    max_buffered: int
    # a tenant stream: its non-terminal tasks, newest first (a poller without a feed asks it again)
    active_tasks: Callable[[], Awaitable[list[dict[str, Any]] | GatewayResponse]] | None = None
    pending: deque[bytes] = field(default_factory=deque)
    buffered: int = 0
    events: int = 0
    early: list[Rendered] | None = field(default_factory=list)  # until the opening state is queued
    ended: str | None = None  # why it ends: set by the fan-out or by the stream itself
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last: dict[str, tuple[str | None, Key]] = field(default_factory=dict)

    @property
    def group(self) -> Group:
        """Subscribers with one group share each rendering: the same tenant (a rendering is asked on its behalf:
        another tenant naming the task gets its own 404, never this one's state), view and link base."""
        return self.tenant, id(self.view), self.link_base

    def offer(self, event: Rendered) -> None:
        if self.ended is not None:
            return
        if self.early is not None:
            self.early.append(event)
            if len(self.early) > EARLY_EVENTS:
                self.end("slow_reader")
            return
        self._accept(event)

    def open(self, opening: list[Rendered], resumed_from: str | None) -> None:
        """Queue the opening state (what the client already has, per `resumed_from`, is not sent again), then
        what arrived meanwhile."""
        for event in opening:
            if resumed_from is not None and event.event_id is not None and not newer(event.event_id, resumed_from):
                self.last[event.task_id] = (resumed_from, event.key)
                if self.task_id is not None and event.terminal:
                    self.end("terminal")
                continue
            self._accept(event)
        early, self.early = self.early or [], None
        for event in early:
            self._accept(event)

    def _accept(self, event: Rendered) -> None:
        if self.ended is not None:
            return
        before = self.last.get(event.task_id)
        if before is not None:
            if not newer(event.event_id, before[0]):
                return
            if event.key == before[1]:
                self.last[event.task_id] = (event.event_id or before[0], before[1])
                return
        if len(self.last) >= REMEMBERED_TASKS and event.task_id not in self.last:
            self.last.clear()
        self.last[event.task_id] = (event.event_id, event.key)
        self.pending.append(event.frame)
        self.buffered += len(event.frame)
        self.events += 1
        if self.buffered > self.max_buffered:
            self.end("slow_reader")
        elif self.task_id is not None and event.terminal:
            self.end("terminal")  # after its frame: the stream sends what is queued, then ends
        self.wake.set()

    def take(self) -> bytes:
        """Everything queued, as one chunk to send."""
        chunk = b"".join(self.pending)
        self.pending.clear()
        self.buffered = 0
        return chunk

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
        self.wake.set()
