"""policy.timeout: `connect` and `read` bound each try; `total` bounds the whole request, all tries included.

The outermost part of the route's upstream call (gateway/policy/__init__.py), so
`total` covers every try and every backoff. It sets the bounds in the context;
the proxy applies them where the waiting happens. Each try's connect and read
timeouts are cut to what is left of `total`, so a try that runs into the deadline
fails as a timeout (and counts as one for the breaker); a socket read timeout
bounds each read, not a whole answer, so the proxy also holds each try to the
deadline itself. Retries do not start a backoff that would end past it. `total`
bounds the time to the answer's headers; a body is then bounded per read by
`read`, and a download streams on for as long as it takes. Nothing is armed for a
request that never reaches the upstream (an open breaker answers without paying
for a timer).
"""
from __future__ import annotations

import time
from typing import Awaitable

from pydantic import Field

from gateway.context import Handler, RequestContext
from gateway.plugins.base import Settings
from gateway.response import GatewayResponse
from gateway.upstream import Timeouts


class TimeoutSettings(Settings):
    connect: float = Field(2.0, gt=0, description="seconds to open a connection (per try)")
    read: float = Field(10.0, gt=0, description="seconds to wait for each read of the answer (per try)")
    total: float = Field(30.0, gt=0, description="seconds for the whole request, all tries included")


class Timeout:
    def __init__(self, next: Handler, settings: TimeoutSettings) -> None:
        self.next = next
        self.per_try = Timeouts(connect=settings.connect, read=settings.read)
        self.total = settings.total

    def __call__(self, ctx: RequestContext) -> Awaitable[GatewayResponse]:
        """The bounds set on the context, then the next part's call, for the caller to await."""
        ctx.timeouts = self.per_try
        ctx.deadline = time.monotonic() + self.total
        return self.next(ctx)
