"""fault: Envoy-style fault injection for tests and game days; off unless configured.

For `percentage` of requests (optionally only those carrying `header`), wait
`delay.seconds` and/or answer `abort.status` without calling the upstream.
"""
from __future__ import annotations

import asyncio
import random
from typing import ClassVar, Literal

from pydantic import Field

from exports_common.errors import ApiError, ErrorKind
from gateway.context import RequestContext
from gateway.plugins.base import PluginBase, Settings
from gateway.response import GatewayResponse

_ABORTS = {500: ErrorKind.INTERNAL, 502: ErrorKind.UPSTREAM_UNREACHABLE, 503: ErrorKind.UNAVAILABLE,
           504: ErrorKind.UPSTREAM_TIMEOUT}


class AbortSettings(Settings):
    status: Literal[500, 502, 503, 504] = 503
    percentage: float = Field(100.0, ge=0, le=100)


class DelaySettings(Settings):
    seconds: float = Field(gt=0, le=600)
    percentage: float = Field(100.0, ge=0, le=100)


class FaultSettings(Settings):
    abort: AbortSettings | None = None
    delay: DelaySettings | None = None
    header: str | None = Field(None, description="inject only into requests carrying this header")


class Fault(PluginBase[FaultSettings]):
    name: ClassVar[str] = "fault"
    Settings: ClassVar[type[FaultSettings]] = FaultSettings

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        s = self.settings
        if s.header is not None and s.header not in ctx.headers:
            return await self.next(ctx)
        if s.delay is not None and random.uniform(0, 100) < s.delay.percentage:
            await asyncio.sleep(s.delay.seconds)
        if s.abort is not None and random.uniform(0, 100) < s.abort.percentage:
            raise ApiError(_ABORTS[s.abort.status], "fault injected by the gateway's fault plugin",
                           data={"fault": "abort"})
        return await self.next(ctx)
