"""Holding back the 429s of a flood, so that a flooding client cannot keep the gateway's CPU to itself.

A refusal is cheap (decided before the body is read, its answer encoded once), but every
request still costs its HTTP parsing and writing: a client refused thousands of times a
second on a few keep-alive connections keeps the event loop busy, and every other tenant's
request waits behind its requests at each await. So once one bucket (a tenant's limit, an
address) has been refused `after_per_sec` times within a second, its further refusals are
answered `hold_sec` later (never more than its `Retry-After`, which is whole seconds, at
least 1): a connection then asks at most 1 / hold_sec times a second, as nginx's
limit_req delays excess requests instead of answering them at once. A client that keeps to
its limit, or overshoots it now and then, is never held; at most `max_held` answers are
held at once per process (each a sleeping coroutine), beyond that they go out at once.
"""
from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel, ConfigDict, Field


class HoldSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hold_sec: float = Field(0.5, ge=0, le=1, description="how much later a flood's refusal is answered; 0: never")
    after_per_sec: int = Field(50, ge=1, description="refusals of one bucket within a second answered at once")
    max_held: int = Field(1000, ge=0, description="answers held at once per process; more go out at once")


class RefusalHold:
    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, int]] = {}  # bucket -> (second, refusals in it)
        self._held = 0

    async def __call__(self, bucket: str, settings: HoldSettings) -> None:
        """Called with each refusal of `bucket`; returns when its answer may go out."""
        second = int(time.monotonic())
        window, count = self._counts.get(bucket, (second, 0))
        count = count + 1 if window == second else 1
        if len(self._counts) > 10_000:  # only buckets refused this second matter
            self._counts = {k: v for k, v in self._counts.items() if v[0] == second}
        self._counts[bucket] = (second, count)
        if count <= settings.after_per_sec or self._held >= settings.max_held or settings.hold_sec <= 0:
            return
        self._held += 1
        try:
            await asyncio.sleep(settings.hold_sec)
        finally:
            self._held -= 1

    @property
    def held(self) -> int:
        return self._held
