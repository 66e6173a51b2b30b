"""outbox: a submit is never lost to an unreachable upstream.

On a submit that fails with a connect error, timeout, open breaker or 502-504,
`mode: outbox` stores the request durably and answers 202 with
`"degraded": true`; the gateway delivers it in order once the upstream is back
(the task keeps its id; the upstream's create is idempotent by id).
`mode: reject` answers 503 with `Retry-After` instead. On a status route the
same plugin answers PENDING for a task still waiting in the outbox, and asks the
upstream once more when the upstream did not know a task that left the outbox lately:
it was delivered in between.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar, Coroutine, Literal

from pydantic import Field

from exports_common.contract import Status, Task, TaskError
from exports_common.errors import ApiError, ErrorKind, unavailable
from exports_common.timefmt import rfc3339
from gateway.context import Handler, RequestContext
from gateway.headers import upstream_headers
from gateway.plugins.base import Contract, CurrentServices, PluginBase, RouteInfo, Settings
from gateway.plugins.outbox.drainer import OutboxDrainer
from gateway.plugins.outbox.store import OutboxItem, OutboxStore, RedisOutbox, SqliteOutbox, new_item
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.telemetry import Tally
from gateway.upstream import UpstreamError

UNAVAILABLE = frozenset({502, 503, 504})


class OutboxSettings(Settings):
    mode: Literal["outbox", "reject"] = "outbox"
    retry_after_sec: int = Field(5, ge=1, description="reject: Retry-After when no breaker says better")
    param: str = Field("task_id", description="status routes: the path parameter naming the task")
    capacity: int = Field(100_000, ge=1, description="entries in all; a full outbox answers 503 (each tenant's "
                                                     "own cap is its max_outbox_entries)")


def pending_task(item: OutboxItem, body: Any) -> dict[str, Any]:
    """The task as the outbox knows it: submitted, not yet seen by the upstream (PENDING), or refused by it
    for good (FAILED, with the upstream's error)."""
    created = rfc3339(item.created_at)
    export_type = body.get("export_type") if isinstance(body, dict) else None
    error = TaskError(**item.error) if item.error is not None else None
    return Task(task_id=item.task_id, export_type=export_type if isinstance(export_type, str) else None,
                status=Status.PENDING if error is None else Status.FAILED, progress=0, current_step=None, attempt=1,
                created_at=created, updated_at=created, result=None, error=error, degraded=True,
                callback=None).answer()


def _store(services: Services) -> OutboxStore:
    state = services.state
    return state.shared("outbox", lambda: RedisOutbox(state.redis, state.prefix) if state.redis is not None
                        else SqliteOutbox(state.path))


def _deliveries(services: Services) -> Tally:
    tally = services.metrics.tally("gateway_outbox", ("outcome",), "outboxed submissions delivered, deferred "
                                   "(refused for now: tried again) or refused")
    for outcome in ("delivered", "deferred", "refused"):
        tally.seed(outcome)
    return tally


class Outbox(PluginBase[OutboxSettings]):
    name: ClassVar[str] = "outbox"
    Settings: ClassVar[type[OutboxSettings]] = OutboxSettings

    def __init__(self, next: Handler, settings: OutboxSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.store = _store(services)
        self.trusted = services.trusted_proxies
        self.tenants = services.tenants
        self.degraded = services.metrics.degraded
        for kind in ("outbox", "outbox_pending", "reject"):
            self.degraded.seed(self.route, kind)

    @classmethod
    def contract(cls, settings: OutboxSettings, methods: tuple[str, ...]) -> Contract:
        """Reads find a task waiting per tenant; `mode: outbox` stores a write as the tenant's, under its
        task id, with its body (read by an earlier plugin: the proxy's stream is gone by then), and answers
        with the export type of the body as parsed (`json`)."""
        writes = any(m not in ("GET", "HEAD") for m in methods)
        if writes and settings.mode == "outbox":
            return Contract(needs=frozenset({"tenant", "task_id", "body", "json"}))
        return Contract(needs=frozenset({"tenant"}) if not writes else frozenset())

    @classmethod
    def background(cls, current: CurrentServices) -> list[Coroutine[Any, Any, None]]:
        services = current()
        return [OutboxDrainer(current, _store(services), _deliveries(services)).run()]

    @classmethod
    def observe(cls, services: Services) -> None:
        metrics = services.metrics
        metrics.observe_gauge("gateway_outbox_depth", "submissions waiting in the outbox for their upstream",
                              lambda: [(metrics.async_values.get("outbox_depth", 0.0), {})], merge="latest")

    @classmethod
    async def before_scrape(cls, services: Services) -> None:
        services.metrics.async_values["outbox_depth"] = float(await _store(services).size())

    @classmethod
    async def stats(cls, services: Services) -> dict[str, Any]:
        deliveries = _deliveries(services)
        return {"outbox": {"pending": await _store(services).size(),
                           "delivered": deliveries.total(outcome="delivered"),
                           "refused": deliveries.total(outcome="refused")}}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if ctx.method in ("GET", "HEAD"):
            return await self._status(ctx)
        try:
            resp = await self.next(ctx)
        except UpstreamError as exc:
            return await self._degrade(ctx, exc.retry_after)
        if resp.status in UNAVAILABLE:
            resp.close()
            return await self._degrade(ctx, None)
        return resp

    async def _degrade(self, ctx: RequestContext, retry_after: float | None) -> GatewayResponse:
        # tenant and task id are declared needs, checked at config time; auth with `required: false`
        # may still leave a request without a tenant, and such a submit is nobody's to keep
        if self.settings.mode == "reject" or ctx.task_id is None or ctx.tenant is None:
            self.degraded.add(self.route, "reject")
            raise unavailable("the export service is unavailable", retry_after or self.settings.retry_after_sec)
        await self._check_room(ctx.tenant)
        headers = [(k, v) for k, v in upstream_headers(ctx, self.trusted) if k != "x-gateway-attempt"]
        item = new_item(ctx.task_id, ctx.tenant, ctx.upstream, ctx.method, ctx.upstream_path, headers,
                        ctx.body or b"")
        await self.store.put(item)
        self.degraded.add(self.route, "outbox")
        return GatewayResponse.envelope(pending_task(item, ctx.json), status=202)

    async def _check_room(self, tenant: str) -> None:
        cap = self.tenants.limits_of(tenant).max_outbox_entries
        waiting = await self.store.tenant_size(tenant)
        if waiting >= cap:
            self.degraded.add(self.route, "outbox_tenant_full")
            raise ApiError(ErrorKind.OUTBOX_FULL, f"tenant {tenant} has {waiting} submissions waiting for the export "
                           f"service, its limit; retry once it is back", data={"waiting": waiting, "limit": cap},
                           headers={"Retry-After": str(self.settings.retry_after_sec)})
        if await self.store.size() >= self.settings.capacity:
            self.degraded.add(self.route, "outbox_full")
            raise unavailable("the export service is unavailable and the gateway's outbox is full",
                              self.settings.retry_after_sec)

    async def _status(self, ctx: RequestContext) -> GatewayResponse:
        """The upstream's answer; PENDING (or FAILED) for a task the outbox holds, which the upstream does not
        know yet."""
        task_id = ctx.params.get(self.settings.param, "")
        try:
            resp = await self.next(ctx)
        except UpstreamError:
            item = await self.store.find(ctx.tenant or "", task_id)
            if item is None:
                raise
            return self._pending(item)
        if resp.status == 404:
            item = await self.store.find(ctx.tenant or "", task_id)
            if item is not None:
                resp.close()
                return self._pending(item)
            if await self.store.left_lately(task_id):
                # delivered between the upstream's 404 and that look: a submission leaves the outbox only once
                # the upstream has answered its create, so asked again now, the upstream has the task
                resp.close()
                return await self.next(ctx)
        return resp

    def _pending(self, item: OutboxItem) -> GatewayResponse:
        self.degraded.add(self.route, "outbox_pending")
        body = json.loads(item.body_bytes or b"{}")
        return GatewayResponse.envelope(pending_task(item, body),
                                        headers={"Retry-After": "1"} if item.error is None else None)
