"""rerun: a task polled in TIMEOUT (or FAILED with `retryable: true`) is started again, degraded.

The gateway asks the upstream's retry endpoint with the attempt it saw and the
route's `overrides` (a longer timeout, a lighter format, `degraded: true`). The
upstream refuses a stale attempt with 409, so however many gateway processes
poll, each attempt is re-run exactly once; the 409 carries the task as it now
is, and that is what the client gets. At most `max_reruns` re-runs per task.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

from pydantic import Field

from exports_common.contract import ACTIVE, FormatName, RerunCause, rerun_cause
from exports_common.errors import ApiError
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.upstream import UpstreamError


class RerunOverrides(Settings):
    timeout_sec: int | None = Field(None, ge=1)
    format: FormatName | None = Field(None, description="one the task's type offers, or the upstream refuses the "
                                                            "re-run")
    degraded: bool = True


def _default_causes() -> list[RerunCause]:
    return ["TIMEOUT", "FAILED_RETRYABLE"]


class RerunSettings(Settings):
    max_reruns: int = Field(1, ge=0, le=10)
    on: list[RerunCause] = Field(default_factory=_default_causes)
    overrides: RerunOverrides = Field(default_factory=RerunOverrides)
    path: str = Field("/exports/{task_id}/retry", description="the upstream's re-run endpoint")
    param: str = "task_id"


class Rerun(PluginBase[RerunSettings]):
    name: ClassVar[str] = "rerun"
    Settings: ClassVar[type[RerunSettings]] = RerunSettings

    def __init__(self, next: Handler, settings: RerunSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.call_upstream = route.call_upstream
        self.outcomes = services.metrics.tally("gateway_reruns", ("route", "outcome"),
                                               "TIMEOUT/FAILED re-runs asked for")
        self.overrides = settings.overrides.model_dump(exclude_none=True)

    def _eligible(self, task: Any) -> bool:
        if not isinstance(task, dict) or task.get("reruns", 0) >= self.settings.max_reruns:
            return False
        error = task.get("error")
        return rerun_cause(str(task.get("status")), error if isinstance(error, dict) else None) in self.settings.on

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        resp = await self.next(ctx)
        doc = await resp.json() if resp.status == 200 else None
        task = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(task, dict) or not self._eligible(task):
            return resp
        current = await self._rerun(ctx, task)
        if current is None:
            return resp
        headers = {"Retry-After": "1"} if current.get("status") in ACTIVE else {}
        return GatewayResponse.envelope(current, headers=headers)

    async def _rerun(self, ctx: RequestContext, task: dict[str, Any]) -> dict[str, Any] | None:
        """The task after asking for the re-run (ours or another gateway's), or None if unknown now."""
        body = json.dumps({"expected_attempt": task["attempt"], "overrides": self.overrides}).encode()
        # through the route's upstream policy, as the status read went: the breaker, retry budget, upstream
        # metrics and client span see the re-run too (the upstream refuses a repeat of it with 409)
        path = self.settings.path.format(task_id=ctx.params.get(self.settings.param, ""))
        call = dataclasses.replace(
            ctx, method="POST", upstream_path=path,
            query="", body=body, upstream_headers={**ctx.upstream_headers, "content-type": "application/json"},
            response_headers={}, attempt=1, retry_reason=None)
        try:
            answer = await self.call_upstream(call)
            doc = json.loads(await answer.read())
        except (UpstreamError, ApiError, ValueError):  # ApiError: the tenant's own breaker is open
            self.outcomes.add(self.route, "error")
            return None
        outcome = {200: "started", 409: "already_started"}.get(answer.status, f"refused_{answer.status}")
        self.outcomes.add(self.route, outcome)
        data = doc.get("data") if isinstance(doc, dict) else None
        return data if answer.status in (200, 409) and isinstance(data, dict) else None
