"""events: a task's status (or all of a tenant's tasks) pushed as server-sent events.

`scope: task` serves `GET /api/v1/exports/{task_id}/events`, `scope: tenant` serves
`GET /api/v1/events`. Listed last on its route (it answers every request itself), after
the gatekeepers the status route has (rate_limit, auth, task_id), which run once, when the
stream opens. Each event carries what the status route (`status_route`) would answer at
that moment, through that route's own plugins (gateway/answer_view.py); the changes come
from the upstream's change feed, one connection per upstream per process, or from one
shared poller per watched task when the upstream has no feed (gateway/plugins/events/hub.py).

The stream: `retry:` first, then the current state at once (for a tenant: the current
state of its non-terminal tasks, newest first, at most `snapshot_limit`), then an event on
every change of status, progress, current_step or attempt; `Last-Event-ID` resumes (on any
gateway: ids are the upstream's change ids). A task's stream ends after its terminal event;
any stream after `idle_close_sec` without an event. Each tenant has at most
`max_open_streams` open (tenant_limits; over it: 429).
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any, ClassVar, Coroutine, Literal

from pydantic import Field

from exports_common import shutdown
from exports_common.errors import ApiError, ErrorKind, unavailable
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Contract, CurrentServices, PluginBase, RouteInfo, Settings
from gateway.plugins.events.cap import StreamCap
from gateway.plugins.events.feed import NoFeed, lines, query
from gateway.plugins.events.hub import Hub
from gateway.plugins.events.stream import EventStream
from gateway.plugins.events.subscriber import EVENT_ID, Rendered, Subscriber, render
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.upstream import UpstreamError

MEDIA_TYPE = "text/event-stream"
# a tenant stream resumed after a break catches up on at most this many of its tasks; more: a fresh start
CATCH_UP_TASKS = 1_000
OUTCOMES = ("terminal", "idle", "client_closed", "slow_reader", "shutdown", "upstream_down", "gone", "error",
            "resync")


class EventsSettings(Settings):
    scope: Literal["task", "tenant"] = Field("task", description="task: one task's stream (the path names it); "
                                                                 "tenant: every task of the caller")
    status_route: str = Field("status", description="the route whose answer each event carries")
    param: str = Field("task_id", description="scope task: the path parameter naming the task")
    list_path: str = Field("/exports", description="scope tenant: where the upstream lists a tenant's tasks")
    heartbeat_sec: float = Field(15.0, gt=0, le=15, description="a comment line at least this often")
    retry_ms: int = Field(3000, ge=100, le=600_000, description="the `retry:` a client waits before reconnecting")
    idle_close_sec: float = Field(3600.0, gt=0, description="a stream with no event this long is closed")
    max_buffered_bytes: int = Field(262_144, ge=4096, description="a reader with more than this waiting is dropped")
    send_timeout_sec: float = Field(30.0, gt=0, description="a reader that takes nothing for this long is dropped")
    poll_interval_sec: float = Field(1.0, gt=0, description="without a feed: how often a watched task is polled")
    snapshot_limit: int = Field(500, ge=1, le=500, description="scope tenant: non-terminal tasks sent at the start")
    open_wait_sec: float = Field(2.0, gt=0, description="how long an opening stream waits for the feed; then 503")
    upstream_down_close_sec: float = Field(30.0, gt=0, description="streams end once the feed has failed this long")


class Hubs:
    """This process's hubs, one per upstream, its stream cap and the streams' counters (outlive reloads)."""

    def __init__(self, services: Services) -> None:
        metrics = services.metrics
        self.cap = StreamCap(services.state.redis, services.state.prefix)
        self.by_upstream: dict[str, Hub] = {}
        self.open_by_route: Counter[str] = Counter()
        self.ended = metrics.tally("gateway_event_streams", ("route", "outcome"),
                                   "event streams ended, by why: terminal, idle, client_closed, slow_reader, "
                                   "shutdown, upstream_down, gone, error, resync")
        self.sent = metrics.tally("gateway_events_sent", ("route",), "events sent on event streams")
        self.feed = metrics.tally("gateway_event_feed", ("upstream", "outcome"),
                                  "change feed connections: connected, failed, gap, resumed, no_feed")
        self.polls = metrics.tally("gateway_event_polls", ("upstream",), "status polls made for event streams "
                                   "(upstreams without a change feed)")
        shutdown.on_shutdown(self.end_all)

    def end_all(self) -> None:
        """A graceful shutdown: every stream ends at once, and its client resumes elsewhere."""
        for hub in self.by_upstream.values():
            hub.end_all("shutdown")

    def hub(self, upstream: str, services: Services) -> Hub:
        hub = self.by_upstream.get(upstream)
        if hub is None:
            hub = self.by_upstream[upstream] = Hub(upstream, services, self.feed, self.polls)
        return hub

    async def run(self) -> None:
        try:
            await self.cap.renew_forever()
            await asyncio.Event().wait()
        finally:
            for hub in self.by_upstream.values():
                hub.stop()


def _hubs(services: Services) -> Hubs:
    return services.state.shared("events", lambda: Hubs(services))


class Events(PluginBase[EventsSettings]):
    name: ClassVar[str] = "events"
    Settings: ClassVar[type[EventsSettings]] = EventsSettings
    terminal_handler: ClassVar[bool] = True

    @classmethod
    def contract(cls, settings: EventsSettings, methods: tuple[str, ...]) -> Contract:
        needs = {"tenant", "task_id"} if settings.scope == "task" else {"tenant"}
        return Contract(needs=frozenset(needs), terminal=True, routes=(settings.status_route,))

    @classmethod
    def background(cls, current: CurrentServices) -> list[Coroutine[Any, Any, None]]:
        return [_hubs(current()).run()]

    @classmethod
    def observe(cls, services: Services) -> None:
        hubs = _hubs(services)
        services.metrics.observe_gauge("gateway_event_streams_open", "event streams open now, by route",
                                       lambda: [(float(n), {"route": r}) for r, n in hubs.open_by_route.items()],
                                       merge="sum", labels=("route",))

    @classmethod
    async def stats(cls, services: Services) -> dict[str, Any]:
        hubs = _hubs(services)
        return {"event_streams": {"open": dict(hubs.open_by_route),
                                  "feeds": {name: hub.mode or "idle" for name, hub in hubs.by_upstream.items()}}}

    def __init__(self, next: Handler, settings: EventsSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        assert route.view_of is not None, "the runtime gives every plugin the routes' views"
        self.view = route.view_of(settings.status_route)
        self.call_upstream = route.call_upstream
        self.hubs = _hubs(services)
        self.hub = self.hubs.hub(self.view.upstream, services)
        self.hub.attach(services, settings.poll_interval_sec, settings.upstream_down_close_sec)
        for outcome in OUTCOMES:
            self.hubs.ended.seed(self.route, outcome)
        self.hubs.sent.seed(self.route)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        tenant = ctx.tenant
        if tenant is None:  # auth with `required: false` before it: a stream is always someone's
            raise ApiError(ErrorKind.UNAUTHORIZED, headers={"WWW-Authenticate": 'Bearer realm="exports"'})
        limits = self.services.tenants.limits
        member = await self.hubs.cap.acquire(tenant, limits.by_tenant[tenant].max_open_streams,
                                             limits.gateway_processes)
        sub = Subscriber(tenant, ctx.task_id if self.settings.scope == "task" else None, self.route, self.view, ctx,
                         self.services.trusted_proxies.link_base(ctx.scope, self.services.public_base_url),
                         self.settings.max_buffered_bytes)
        if sub.task_id is None:
            sub.active_tasks = lambda: self._active(ctx)
        opened = False
        try:
            if not await self.hub.subscribe(sub, self.settings.open_wait_sec):
                raise unavailable("the export service's changes cannot be followed right now; poll the task's "
                                  "status instead", self.settings.retry_ms / 1000)
            resumed_from = _last_event_id(ctx)
            opening = await (self._task_opening(ctx, sub) if sub.task_id is not None
                             else self._tenant_opening(ctx, resumed_from))
            if isinstance(opening, GatewayResponse):
                return opening  # the status route's refusal (404, 503, ...): the stream's answer
            sub.open(opening, resumed_from)
            opened = True
        finally:
            if not opened:
                self.hub.unsubscribe(sub)
                await self.hubs.cap.release(tenant, member)
        self.hubs.open_by_route[self.route] += 1

        async def finish(outcome: str, events: int) -> None:
            self.hub.unsubscribe(sub)
            self.hubs.open_by_route[self.route] -= 1
            self.hubs.ended.add(self.route, outcome)
            self.hubs.sent.add(self.route, amount=events)
            await self.hubs.cap.release(tenant, member)

        stream = EventStream(sub, self.settings.retry_ms, self.settings.heartbeat_sec, self.settings.idle_close_sec,
                             self.settings.send_timeout_sec, finish)
        return GatewayResponse(200, [("content-type", MEDIA_TYPE), ("cache-control", "no-cache"),
                                     ("x-accel-buffering", "no")], events=stream)

    async def _task_opening(self, ctx: RequestContext, sub: Subscriber) -> list[Rendered] | GatewayResponse:
        assert ctx.task_id is not None
        held = self.hub.current(sub)
        if held is not None:
            return [held]
        resp = await self.view.answer(ctx, ctx.task_id, None)
        if resp.status != 200:
            return resp
        event = await render(resp)
        if event is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        self.hub.remember(sub, event)
        return [event]

    async def _tenant_opening(self, ctx: RequestContext, resumed_from: str | None) -> list[Rendered] | GatewayResponse:
        tasks = await self._caught_up(ctx, resumed_from) if resumed_from is not None else None
        if tasks is None:
            found = await self._active(ctx)
            if isinstance(found, GatewayResponse):
                return found
            tasks = found
        opening = []
        for task in tasks:
            event = await render(await self.view.answer(ctx, task["task_id"], task))
            if event is not None:
                opening.append(event)
        return opening

    def _upstream_ctx(self, ctx: RequestContext, path: str, q: str) -> RequestContext:
        return dataclasses.replace(ctx, method="GET", upstream_path=path, query=q, body=None, response_headers={},
                                   attempt=1, retry_reason=None, held=None)

    async def _active(self, ctx: RequestContext) -> list[dict[str, Any]] | GatewayResponse:
        """The tenant's PENDING and RUNNING tasks, newest first, at most `snapshot_limit`; or the refusal."""
        found: list[dict[str, Any]] = []
        for status in ("PENDING", "RUNNING"):
            q = f"status={status}&limit={self.settings.snapshot_limit}"
            resp = await self.call_upstream(self._upstream_ctx(ctx, self.settings.list_path, q))
            doc = await resp.json() if resp.status == 200 else None
            items = doc.get("data", {}).get("items") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                return resp
            found += [t for t in items if isinstance(t, dict) and isinstance(t.get("task_id"), str)]
        found.sort(key=lambda t: str(t.get("created_at")), reverse=True)
        return found[:self.settings.snapshot_limit]

    async def _caught_up(self, ctx: RequestContext, after: str) -> list[dict[str, Any]] | None:
        """The tenant's tasks that changed after `after`, each in its newest state, in log order; None when
        the log no longer reaches back that far (or the upstream has no feed): then a fresh start."""
        feed = self.services.upstreams[self.view.upstream].feed
        if feed is None or self.hub.mode != "feed":
            return None
        newest: dict[str, tuple[str, dict[str, Any]]] = {}
        try:
            resp = await self.call_upstream(self._upstream_ctx(ctx, feed.path, query(after, ctx.tenant, False)))
            async for line in lines(resp):
                if "gap" in line:
                    return None
                change, task = line.get("id"), line.get("task")
                if isinstance(change, str) and isinstance(task, dict) and isinstance(task.get("task_id"), str):
                    newest.pop(task["task_id"], None)
                    newest[task["task_id"]] = (change, task)
                    if len(newest) > CATCH_UP_TASKS:
                        return None
        except (UpstreamError, NoFeed):
            return None
        return [task for _, task in newest.values()]


def _last_event_id(ctx: RequestContext) -> str | None:
    value = ctx.headers.get("last-event-id")
    return value if value is not None and EVENT_ID.fullmatch(value) else None

