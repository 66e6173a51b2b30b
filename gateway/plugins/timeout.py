"""timeout: `connect` and `read` bound each try; `total` bounds the whole request, all tries included.

The per-try bounds go to the upstream client through the context, cut to what
is left of `total`, so a try that runs into the deadline fails as a timeout (and
counts as one for the breaker). A socket read timeout bounds each read, not a
whole answer, so a deadline of its own (a little after `total`) backs that up.
It bounds the time to the answer's headers (and to JSON bodies the plugins
read); a download streams on after that for as long as it takes.
"""
from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from pydantic import Field

from gateway.context import Handler, RequestContext
from gateway.plugins.base import Settings
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.upstream import Timeouts, UpstreamError

BACKSTOP_SEC = 0.25


class TimeoutSettings(Settings):
    connect: float = Field(2.0, gt=0, description="seconds to open a connection (per try)")
    read: float = Field(10.0, gt=0, description="seconds to wait for each read of the answer (per try)")
    total: float = Field(30.0, gt=0, description="seconds for the whole request, all tries included")


class Timeout:
    name: ClassVar[str] = "timeout"
    Settings: ClassVar[type[TimeoutSettings]] = TimeoutSettings

    def __init__(self, next: Handler, settings: TimeoutSettings, services: Services, route: str) -> None:
        self.next = next
        self.settings = settings
        self.per_try = Timeouts(connect=settings.connect, read=settings.read)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        ctx.timeouts = self.per_try
        ctx.deadline = time.monotonic() + self.settings.total
        try:
            async with asyncio.timeout(self.settings.total + BACKSTOP_SEC):
                return await self.next(ctx)
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"no answer within the route's total of {self.settings.total} s") from exc
