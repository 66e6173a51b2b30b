"""When to send the next request: the SDK's whole timing policy, free of I/O so a test can run it on a fake clock.

- The gateway's `Retry-After` comes first, with up to 20% jitter added on top so
  clients told the same number do not come back together; the jitter never takes a
  delay past the 30 s ceiling unless the gateway itself asked for more, so a
  finished task is noticed at most 30 s late.
- Without one: exponential backoff with full jitter, a delay drawn between 1 s
  and a ceiling that doubles from 1 s up to 30 s.
- A refusal (429, 503, a transport error) never speeds a client up: the delay is
  at least what the gateway asked and at least the pace the client had.
- A status the SDK does not know (from a newer gateway) is followed while the
  gateway asks for another poll with `Retry-After`, and ends the wait when it does not.
"""
from __future__ import annotations

import email.utils
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exports_client.errors import ExportsError
from exports_client.models import Task

FLOOR_SEC = 1.0
CEILING_SEC = 30.0
JITTER = 0.2
TOKEN_VERSION = 1

Clock = Callable[[], float]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit() also takes other scripts' digits, '²'
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def honour(retry_after: float, rng: random.Random) -> float:
    """`retry_after` plus up to 20% jitter, kept under the ceiling unless the gateway asked for more."""
    return min(retry_after * (1 + rng.uniform(0, JITTER)), max(retry_after, CEILING_SEC))


def full_jitter(step: int, rng: random.Random, floor: float = FLOOR_SEC, ceiling: float = CEILING_SEC) -> float:
    return rng.uniform(floor, max(floor, min(ceiling, floor * 2 ** step)))


@dataclass
class PollPlan:
    """One `wait`: when the next status poll may go out, and when the cap is reached."""

    task_id: str
    deadline: float
    rng: random.Random
    not_before: float = 0.0
    step: int = 0
    pace: float = FLOOR_SEC
    transport_failures: int = 0
    last: Task | None = field(default=None)

    def sleep_before_poll(self, now: float) -> float | None:
        """Seconds to sleep before the next poll; None when the cap comes first."""
        if self.not_before > self.deadline:
            return None
        return max(0.0, self.not_before - now)

    def _schedule(self, now: float, delay: float) -> None:
        self.pace = delay
        self.not_before = now + delay

    def answered(self, now: float, task: Task, retry_after: float | None) -> None:
        self.last = task
        self.transport_failures = 0
        if retry_after is not None:
            self._schedule(now, honour(max(retry_after, FLOOR_SEC), self.rng))
        else:
            self._schedule(now, full_jitter(self.step, self.rng))
            self.step += 1

    def refused(self, now: float, retry_after: float | None) -> None:
        """A 429/503 (or a transport error, retry_after None): back off, never faster than before."""
        own = self.rng.uniform(self.pace, max(self.pace, min(CEILING_SEC, 2 * self.pace)))
        asked = honour(retry_after, self.rng) if retry_after is not None else 0.0
        self._schedule(now, max(own, asked, FLOOR_SEC))

    def token(self) -> str:
        return json.dumps({"v": TOKEN_VERSION, "task_id": self.task_id, "not_before": round(self.not_before, 3),
                           "step": self.step, "pace": round(self.pace, 3)}, separators=(",", ":"))


def finished(task: Task, retry_after: float | None) -> bool:
    """Whether a wait is over: a final status, or a status this SDK does not know (a newer gateway's) answered
    without `Retry-After`, which the gateway sends with every status still in progress."""
    if task.terminal or task.running:
        return task.terminal
    return retry_after is None


def is_token(value: str) -> bool:
    return value.lstrip().startswith("{")


def plan_for(task_id_or_token: str, now: float, max_wait: float, rng: random.Random) -> PollPlan:
    """A fresh plan for a task id, or the plan a `WaitTimeout`'s resume token left off at."""
    if not is_token(task_id_or_token):
        return PollPlan(task_id_or_token, now + max_wait, rng)
    try:
        raw = json.loads(task_id_or_token)
        if raw.get("v") != TOKEN_VERSION:
            raise ExportsError(f"resume token version {raw.get('v')!r} is not {TOKEN_VERSION}; "
                               "wait on the task id instead")
        return PollPlan(str(raw["task_id"]), now + max_wait, rng, not_before=float(raw["not_before"]),
                        step=int(raw["step"]), pace=float(raw["pace"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ExportsError(f"not a resume token: {exc}") from exc
