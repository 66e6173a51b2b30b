"""Background loops: one shape for every forever-loop (sweeps, deliveries, drains, workers).

`periodic` runs a step again and again. A failure the loop expects (its store is
down) is one warning line without a traceback saying what to do, then at most one
line a minute while it lasts, and one line when it works again; anything else is
logged with its traceback once per spell. The loop never dies of a failed step
and stops only when cancelled. `running` starts loops and keeps a reference to
each (the event loop holds tasks weakly), then cancels and awaits them.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

REPEAT_LOG_SEC = 60.0

# a step's say on when it runs next: True/None at the interval, False backs off (it is waiting for something)
Step = Callable[[], Awaitable[bool | None]]


class _Spell:
    """One run of failures: what was logged and when, so a long outage costs one line a minute."""

    def __init__(self, name: str, log: logging.Logger) -> None:
        self.name = name
        self.log = log
        self.failures = 0
        self.logged_at = -REPEAT_LOG_SEC
        self.traced = False

    def failed(self, exc: Exception, advice: str | None) -> None:
        self.failures += 1
        now = time.monotonic()
        if advice is None and not self.traced:
            self.traced = True
            self.logged_at = now
            self.log.exception(f"{self.name} failed unexpectedly; it runs again at its next interval")
        elif now - self.logged_at >= REPEAT_LOG_SEC:
            self.logged_at = now
            what = advice or "an unexpected error, logged above with its traceback"
            self.log.warning(f"{self.name} failed: {what}",
                             extra={"error": f"{type(exc).__name__}: {exc}"[:300], "failures": self.failures})

    def ended(self) -> None:
        if self.failures:
            self.log.info(f"{self.name} works again", extra={"failures": self.failures})
        self.failures, self.logged_at, self.traced = 0, -REPEAT_LOG_SEC, False


async def periodic(name: str, step: Step, interval_sec: float, log: logging.Logger, *,
                   expected: Mapping[type[Exception], str] | None = None, retry_sec: float | None = None,
                   max_backoff_sec: float | None = None, jitter: float = 0.1) -> None:
    """Run `step` every `interval_sec` (+-jitter, so processes started together drift apart) until cancelled.

    `expected` maps the exceptions the loop lives with to what an operator should do about them.
    After a failed step, or one that returns False, the next waits `retry_sec` (default: the
    interval), or with `max_backoff_sec` twice as long as the last wait, up to that cap.
    """
    spell = _Spell(name, log)
    advice = dict(expected or {})
    delay = interval_sec
    while True:
        try:
            done = await step()
        except tuple(advice) as exc:
            spell.failed(exc, next(text for kind, text in advice.items() if isinstance(exc, kind)))
            done = False
        except Exception as exc:  # noqa: BLE001 - a loop that dies of one bad step stops its job for good
            spell.failed(exc, None)
            done = False
        else:
            spell.ended()
        if done is False:
            base = interval_sec if retry_sec is None else retry_sec
            delay = base if max_backoff_sec is None else min(max_backoff_sec, max(delay * 2, base))
        else:
            delay = interval_sec
        await asyncio.sleep(delay * random.uniform(1 - jitter, 1 + jitter))


@contextlib.asynccontextmanager
async def running(*loops: Coroutine[Any, Any, None]) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Run `loops` as tasks for the block's duration; on leaving, cancel them and wait until they stopped."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
