"""The fan-out of one upstream's task changes to every stream of this gateway process that watches them.

A hub follows its upstream's change feed over one HTTP connection (gateway/plugins/events/
feed.py) while any stream is open, and a little after. Each change that someone here
watches (its task, or its tenant) is rendered once through the status route's answer
view (gateway/answer_view.py: signed link, outbox, TIMEOUT re-run) per group of watchers
sharing a view and link base, then offered to each watcher; changes of one task are
rendered in order, one at a time, so a re-run's answer never overtakes the change before it.

Without a feed (the upstream answers it 404, 405 or 501, or `change_feed` is null) the hub
runs one poller per watched task (and per watched tenant), each asking through the view
every `poll_interval_sec`, so watchers of one task never cost the upstream a call each.

Faults: a dropped feed reconnects from its last position with jittered backoff, so nothing
is missed; a feed that cannot be followed for `upstream_down_close_sec` ends every stream
it serves (clients reopen and, if the upstream is still away, fall back to polling the
status route); a gap (the hub fell behind the log's retention) re-reads the current state
of every watched task and ends the tenant streams, which reopen from a fresh state.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Literal

from exports_common.backoff import backoff
from gateway.plugins.events.feed import NoFeed, follow
from gateway.plugins.events.subscriber import Group, Rendered, Subscriber, render
from gateway.services import Services
from gateway.telemetry import Tally
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.events")

# the feed stays followed this long after its last watcher left, so a wave of reconnects finds it open
LINGER_SEC = 60.0
BACKOFF_MIN_SEC = 0.1
BACKOFF_MAX_SEC = 5.0
Mode = Literal["feed", "poll"]
# a queued rendering: the state the feed pushed, or None to read the current state through the view
Held = dict[str, Any] | None


class Hub:
    def __init__(self, upstream: str, services: Services, feed_outcomes: Tally, polls: Tally) -> None:
        self.upstream = upstream
        self.services = services  # the newest config's (attach)
        self.feed_outcomes = feed_outcomes
        self.polls = polls
        self.poll_interval_sec = 1.0
        self.down_close_sec = 30.0
        self.by_task: dict[str, set[Subscriber]] = {}
        self.by_tenant: dict[str, set[Subscriber]] = {}
        self.mode: Mode | None = None
        self.position: str | None = None  # the newest change id the feed has shown
        self.ready = asyncio.Event()  # the feed is connected with a known position, or the hub polls
        self._runner: asyncio.Task[None] | None = None
        self._idle_since = time.monotonic()
        self._queues: dict[str, deque[Held]] = {}  # per task, renderings waiting their turn
        self._workers: set[asyncio.Task[None]] = set()
        self._pollers: dict[str, asyncio.Task[None]] = {}  # "task:<id>" or "tenant:<name>"
        # the newest rendering of each task watched on its own stream, per group: a stream opening on a task
        # already watched here starts from it, at no upstream call, while the feed keeps it current
        self._latest: dict[str, dict[Group, Rendered]] = {}

    def attach(self, services: Services, poll_interval_sec: float, down_close_sec: float) -> None:
        self.services = services
        self.poll_interval_sec = poll_interval_sec
        self.down_close_sec = down_close_sec

    @property
    def open(self) -> int:
        return sum(len(s) for s in self.by_task.values()) + sum(len(s) for s in self.by_tenant.values())

    async def subscribe(self, sub: Subscriber, wait_sec: float) -> bool:
        """Watch for `sub` from now on; True once the hub can tell it every change (within `wait_sec`)."""
        index = self.by_task if sub.task_id is not None else self.by_tenant
        index.setdefault(sub.task_id if sub.task_id is not None else sub.tenant, set()).add(sub)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name=f"events-hub-{self.upstream}")
        if self.mode == "poll":
            self._start_poller(sub)
        if not self.ready.is_set():
            try:
                await asyncio.wait_for(self.ready.wait(), wait_sec)
            except TimeoutError:
                return False
        return True

    def unsubscribe(self, sub: Subscriber) -> None:
        index, key = (self.by_task, sub.task_id) if sub.task_id is not None else (self.by_tenant, sub.tenant)
        subs = index.get(key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del index[key]
                self._latest.pop(key, None)
        if not self.open:
            self._idle_since = time.monotonic()

    def current(self, sub: Subscriber) -> Rendered | None:
        """The state a task stream opens with when the hub already holds it (None: ask the status route)."""
        if self.mode != "feed" or not self.ready.is_set() or sub.task_id is None:
            return None
        return self._latest.get(sub.task_id, {}).get(sub.group)

    def remember(self, sub: Subscriber, event: Rendered) -> None:
        if event.task_id in self.by_task:
            self._latest.setdefault(event.task_id, {})[sub.group] = event

    def stop(self) -> None:
        for task in [self._runner, *self._workers, *self._pollers.values()]:
            if task is not None:
                task.cancel()

    # -- rendering and delivery ------------------------------------------------------------------

    def _watchers(self, task_id: str, tenant: str | None) -> list[Subscriber]:
        found = list(self.by_task.get(task_id, ()))
        if tenant is not None:
            found += self.by_tenant.get(tenant, ())
        return found

    def _enqueue(self, task_id: str, held: Held) -> None:
        queue = self._queues.get(task_id)
        if queue is not None:
            queue.append(held)
            return
        self._queues[task_id] = deque([held])
        worker = asyncio.create_task(self._render_in_turn(task_id))
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    async def _render_in_turn(self, task_id: str) -> None:
        queue = self._queues[task_id]
        try:
            while queue:
                held = queue.popleft()
                tenant = held.get("tenant") if held is not None else None
                await self.deliver(task_id, self._watchers(task_id, tenant),
                                   held.get("task") if held is not None else None)
        finally:
            del self._queues[task_id]

    async def deliver(self, task_id: str, watchers: list[Subscriber], held: Held) -> None:
        """Render `held` (or the current state) once per group of `watchers` and offer it to each."""
        groups: dict[Group, list[Subscriber]] = {}
        for sub in watchers:
            if sub.ended is None:
                groups.setdefault(sub.group, []).append(sub)
        for subs in groups.values():
            first = subs[0]
            try:
                event = await render(await first.view.answer(first.origin, task_id, held))
            except Exception as exc:  # noqa: BLE001 - Redis, the upstream or a plugin: these streams end, cleanly
                log.warning("an event could not be rendered; its streams end and their clients reopen them",
                            extra={"task_id": task_id, "error": f"{type(exc).__name__}: {exc}"[:300]})
                for sub in subs:
                    sub.end("error")
                continue
            self._offer(subs, task_id, event)

    def _offer(self, subs: list[Subscriber], task_id: str, event: Rendered | None) -> None:
        if event is not None:
            self.remember(subs[0], event)
        for sub in subs:
            if event is not None:
                sub.offer(event)
            elif sub.task_id == task_id:
                sub.end("gone")  # the task is no more (expired, deleted): its own stream ends

    # -- following the feed ----------------------------------------------------------------------

    def _wanted(self) -> bool:
        return bool(self.open) or time.monotonic() - self._idle_since < LINGER_SEC

    async def _run(self) -> None:
        failures, down_since = 0, None  # failures: in a row, since the feed last gave a line
        try:
            while self._wanted():
                upstream = self.services.upstreams.get(self.upstream)
                feed = upstream.feed if upstream is not None else None
                if upstream is None or feed is None:
                    await self._poll_for(LINGER_SEC)
                    continue
                fresh = self.mode != "feed"
                try:
                    async for line in follow(self.services, upstream, feed, None if fresh else self.position):
                        self._on_line(line, fresh)
                        fresh, failures, down_since = False, 0, None
                except NoFeed:
                    self.feed_outcomes.add(self.upstream, "no_feed")
                    log.info("the upstream serves no change feed; event streams poll each watched task",
                             extra={"upstream": self.upstream})
                    await self._poll_for(feed.reprobe_sec)
                except (UpstreamError, OSError) as exc:
                    self.ready.clear()
                    self.feed_outcomes.add(self.upstream, "failed")
                    now = time.monotonic()
                    down_since = down_since or now
                    log.warning("the change feed failed; reconnecting", extra={"upstream": self.upstream,
                                                                               "error": str(exc)[:300]})
                    if now - down_since >= self.down_close_sec:
                        self.end_all("upstream_down")
                    await asyncio.sleep(backoff(failures, BACKOFF_MIN_SEC, BACKOFF_MAX_SEC))
                    failures += 1
        finally:
            self.ready.clear()
            self.mode = None
            self._stop_pollers()

    def _on_line(self, line: dict[str, Any], fresh: bool) -> None:
        change = line.get("id")
        if isinstance(change, str):
            self.position = change
            task_id = line.get("task_id")
            if isinstance(task_id, str) and isinstance(line.get("task"), dict) and \
                    self._watchers(task_id, line.get("tenant")):
                self._enqueue(task_id, line)
            return
        position = line.get("position")
        if isinstance(position, str):
            self.position = position or None
        if "gap" in line or (fresh and self.mode == "poll"):
            # changes were missed (the log was trimmed past us, or we polled until now): read again
            self.feed_outcomes.add(self.upstream, "gap" if "gap" in line else "resumed")
            self._resync()
        if self.mode != "feed":
            self._stop_pollers()
            self.mode = "feed"
            self.feed_outcomes.add(self.upstream, "connected")
        self.ready.set()

    def _resync(self) -> None:
        for task_id, subs in list(self.by_task.items()):
            if any(s.early is None for s in subs):
                self._enqueue(task_id, None)
        for subs in list(self.by_tenant.values()):
            for sub in list(subs):
                sub.end("resync")

    def end_all(self, reason: str) -> None:
        for index in (self.by_task, self.by_tenant):
            for subs in list(index.values()):
                for sub in list(subs):
                    sub.end(reason)

    # -- without a feed: shared pollers ----------------------------------------------------------

    async def _poll_for(self, seconds: float) -> None:
        """Poll every watched task and tenant for `seconds` (each poller stops when nobody watches it), then try
        the feed again."""
        if self.mode != "poll":
            self.mode = "poll"
            for subs in [*self.by_task.values(), *self.by_tenant.values()]:
                for sub in subs:
                    self._start_poller(sub)
        self.ready.set()
        await asyncio.sleep(seconds)

    def _start_poller(self, sub: Subscriber) -> None:
        key = f"task:{sub.task_id}" if sub.task_id is not None else f"tenant:{sub.tenant}"
        if key not in self._pollers:
            poll = self._poll_task(sub.task_id) if sub.task_id is not None else self._poll_tenant(sub.tenant)
            self._pollers[key] = asyncio.create_task(poll)

    def _stop_pollers(self) -> None:
        for poller in self._pollers.values():
            poller.cancel()
        self._pollers.clear()

    async def _poll_task(self, task_id: str) -> None:
        try:
            while self.by_task.get(task_id):
                await asyncio.sleep(self.poll_interval_sec)
                self.polls.add(self.upstream)
                await self.deliver(task_id, list(self.by_task.get(task_id, ())), None)
        finally:
            self._pollers.pop(f"task:{task_id}", None)

    async def _poll_tenant(self, tenant: str) -> None:
        """The tenant's non-terminal tasks each round, and once more each task that left them (it finished)."""
        known: set[str] = set()
        try:
            while self.by_tenant.get(tenant):
                await asyncio.sleep(self.poll_interval_sec)
                subs = list(self.by_tenant.get(tenant, ()))
                if not subs or subs[0].active_tasks is None:
                    continue
                self.polls.add(self.upstream)
                tasks = await subs[0].active_tasks()
                if not isinstance(tasks, list):
                    tasks.close()
                    continue
                seen = {t["task_id"] for t in tasks if isinstance(t.get("task_id"), str)}
                for task in tasks:
                    if task.get("task_id") in seen:
                        await self.deliver(task["task_id"], subs, task)
                for task_id in known - seen:
                    await self.deliver(task_id, subs, None)
                known = seen
        finally:
            self._pollers.pop(f"tenant:{tenant}", None)
