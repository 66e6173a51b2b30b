"""rerun: a task polled in TIMEOUT (or FAILED with `retryable: true`) is started again, degraded.

The gateway asks the upstream's retry endpoint with the attempt it saw and the
route's `overrides` (a longer timeout, a lighter format, `degraded: true`). The
upstream refuses a stale attempt with 409, so however many gateway processes
poll, each attempt is re-run exactly once; the 409 carries the task as it now
is, and that is what the client gets. At most `max_reruns` re-runs per task.
"""
from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import Field

from exports_common.contract import ACTIVE, Format, RerunCause, rerun_cause
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Settings
from gateway.proxy import upstream_headers
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.upstream import UpstreamError


class RerunOverrides(Settings):
    timeout_sec: int | None = Field(None, ge=1)
    format: Format | None = None
    degraded: bool = True


def _default_causes() -> list[RerunCause]:
    return ["TIMEOUT", "FAILED_RETRYABLE"]


class RerunSettings(Settings):
    max_reruns: int = Field(1, ge=0, le=10)
    on: list[RerunCause] = Field(default_factory=_default_causes)
    overrides: RerunOverrides = Field(default_factory=RerunOverrides)
    path: str = Field("/exports/{task_id}/retry", description="the upstream's re-run endpoint")
    param: str = "task_id"


class Rerun:
    name: ClassVar[str] = "rerun"
    Settings: ClassVar[type[RerunSettings]] = RerunSettings

    def __init__(self, next: Handler, settings: RerunSettings, services: Services, route: str) -> None:
        self.next = next
        self.settings = settings
        self.services = services
        self.route = route
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
        upstream = self.services.upstreams[ctx.upstream]
        url = upstream.url + self.settings.path.format(task_id=ctx.params.get(self.settings.param, ""))
        body = json.dumps({"expected_attempt": task["attempt"], "overrides": self.overrides}).encode()
        forwarded = upstream_headers(ctx, self.services.trusted_proxies)
        headers = [h for h in forwarded if h[0] != "content-type"] + [("content-type", "application/json")]
        try:
            answer = await self.services.client.request("POST", url, headers, body, ctx.timeouts or upstream.timeouts)
            doc = json.loads(await answer.read())
        except (UpstreamError, ValueError):
            self.services.metrics.reruns.add(self.route, "error")
            return None
        outcome = {200: "started", 409: "already_started"}.get(answer.status, f"refused_{answer.status}")
        self.services.metrics.reruns.add(self.route, outcome)
        data = doc.get("data") if isinstance(doc, dict) else None
        return data if answer.status in (200, 409) and isinstance(data, dict) else None
