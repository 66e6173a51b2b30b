"""task_id: the gateway names every task.

`generate` (on the submit route) sends the task's id upstream as `X-Task-Id`: the
one an earlier plugin fixed on the context (`idempotency` does, at claim time, so
a retried submit re-sends it), else a fresh one. It turns the upstream's 200/201 into the contract's 202 with
`Location` and `Retry-After`. `check` (on routes with a task id in the path)
answers 404 at once for anything that is not a task id, without an upstream call.
"""
from __future__ import annotations

from typing import Awaitable, ClassVar, Literal

from pydantic import Field

from exports_common.errors import ApiError, ErrorKind
from exports_common.task_ids import PREFIX_PATTERN, is_task_id, new_task_id
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Contract, Gatekeeper, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services


class TaskIdSettings(Settings):
    action: Literal["generate", "check"]
    prefix: str = Field("exp", pattern=PREFIX_PATTERN.pattern)
    param: str = "task_id"
    location: str = Field("/api/v1/exports/{task_id}", description="generate: the Location of the new task")
    retry_after_sec: int = Field(1, ge=1, description="generate: when to poll first")


class TaskId(Gatekeeper[TaskIdSettings]):
    name: ClassVar[str] = "task_id"
    Settings: ClassVar[type[TaskIdSettings]] = TaskIdSettings
    provides: ClassVar[frozenset[str]] = frozenset({"task_id"})  # either action: `contract` says how

    @classmethod
    def contract(cls, settings: TaskIdSettings, methods: tuple[str, ...]) -> Contract:
        if settings.action == "check":
            return Contract(provides=frozenset({"task_id"}))
        # generate mints an id only when an earlier plugin fixed none, and every id of the route has one prefix
        return Contract(defaults=frozenset({"task_id"}), agrees=(("task_id_prefix", settings.prefix),))

    def __init__(self, next: Handler, settings: TaskIdSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.check = settings.action == "check"
        self.param = settings.param

    def admit(self, ctx: RequestContext) -> Awaitable[GatewayResponse] | None:
        if not self.check:
            return self._generated(ctx)
        task_id = ctx.params.get(self.param, "")
        if not is_task_id(task_id):
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        ctx.task_id = task_id
        return None

    async def _generated(self, ctx: RequestContext) -> GatewayResponse:
        """generate: the upstream's answer for the task named here, a new task's 202 when it took it."""
        if ctx.task_id is None:
            ctx.task_id = new_task_id(self.settings.prefix)
        ctx.upstream_headers["x-task-id"] = ctx.task_id
        resp = await self.next(ctx)
        if resp.status in (200, 201, 202):
            resp.status = 202
            resp.set_header("location", self.settings.location.format(task_id=ctx.task_id))
            resp.set_header("retry-after", str(self.settings.retry_after_sec))
        return resp
