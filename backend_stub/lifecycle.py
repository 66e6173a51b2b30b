"""The task state machine as pure functions: each takes a record and returns the next one or None.

Stores apply them atomically (TaskStore.update), so every transition of a task is
written down once, here.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from backend_stub.models import Task, error_info
from backend_stub.store import Change
from exports_common.contract import ACTIVE, TERMINAL, DeliveryState, Status, rerun_cause


def _next(task: Task, **changes: Any) -> Task:
    return dataclasses.replace(task, updated_at=time.time(), **changes)


def begin(max_attempts: int) -> Change:
    """A worker starts the task. A RUNNING record means its last worker died: that attempt is over."""

    def change(task: Task) -> Task | None:
        if task.status not in ACTIVE:
            return None
        attempt = task.attempt + 1 if task.status == Status.RUNNING else task.attempt
        if attempt - task.base_attempt >= max_attempts:
            return finish(Status.FAILED, error=error_info("WORKER_LOST", "the worker running this task stopped, "
                                                   "and no attempts are left", retryable=False))(task)
        now = time.time()
        return _next(task, status=Status.RUNNING, attempt=attempt, started_at=now, progress=0, current_step="query",
                     error=None)

    return change


def report(attempt: int, progress: int, step: str) -> Change:
    """Progress from the worker running `attempt`; refused once the task moved on without it."""

    def change(task: Task) -> Task | None:
        if task.status != Status.RUNNING or task.attempt != attempt:
            return None
        if progress <= task.progress and step == task.current_step:
            return None
        return _next(task, progress=max(progress, task.progress), current_step=step)

    return change


def finish(status: str, *, attempt: int | None = None, ttl_sec: float = 86_400, **fields: Any) -> Change:
    """End the task in a terminal status; with `attempt`, only if that attempt is still the running one.

    A task with a callback_url gets a new notification, due at once.
    """

    def change(task: Task) -> Task | None:
        if task.status in TERMINAL:
            return None
        if attempt is not None and (task.status != Status.RUNNING or task.attempt != attempt):
            return None
        now = time.time()
        extra: dict[str, Any] = {"progress": 100} if status == Status.COMPLETED else {}
        ended = _next(task, status=status, finished_at=now, expire_at=now + ttl_sec, current_step=None,
                      **extra, **fields)
        return notify(ended, now) if ended.callback_url else ended

    return change


def notify(task: Task, now: float) -> Task:
    """A new notification of the task's (terminal) state; it replaces one still pending."""
    seq = task.callback_seq + 1
    event = {"status": task.status, "error": task.error, "attempt": task.attempt, "expire_at": task.expire_at,
             "has_result": task.result is not None}
    callback = {"state": DeliveryState.PENDING, "attempts": 0, "last_error": None, "seq": seq,
                "webhook_id": f"msg_{task.task_id}_{seq}", "next_at": now, "event": event}
    return dataclasses.replace(task, callback_seq=seq, callback=callback)


def callback_attempted(seq: int, error: str | None, delays: list[float], final: bool = False) -> Change:
    """Record one delivery try of notification `seq`: delivered, failed for good, or due again later."""

    def change(task: Task) -> Task | None:
        cb = task.callback
        if cb is None or cb.get("seq") != seq or cb["state"] != DeliveryState.PENDING:
            return None
        attempts = cb["attempts"] + 1
        if error is None:
            state, next_at = DeliveryState.DELIVERED, None
        elif final or attempts > len(delays):
            state, next_at = DeliveryState.FAILED, None
        else:
            state, next_at = DeliveryState.PENDING, time.time() + delays[attempts - 1]
        return dataclasses.replace(task, callback=dict(cb, state=state, attempts=attempts, last_error=error,
                                                       next_at=next_at))

    return change


def requeue(attempt: int) -> Change:
    """After a transient failure: back to PENDING as the next attempt."""

    def change(task: Task) -> Task | None:
        if task.status != Status.RUNNING or task.attempt != attempt:
            return None
        return _next(task, status=Status.PENDING, attempt=attempt + 1, progress=0, current_step=None, started_at=None)

    return change


def release(attempt: int) -> Change:
    """Give the task back to the queue when the attempt stopped for a reason of this backend's (its disk was
    full), not the task's: the next start is a new attempt (so writes of this one stay fenced off), and the
    attempt does not count against max_attempts (the budget's base moves with it)."""

    def change(task: Task) -> Task | None:
        if task.status != Status.RUNNING or task.attempt != attempt:
            return None
        return _next(task, status=Status.PENDING, attempt=attempt + 1, base_attempt=task.base_attempt + 1, progress=0,
                     current_step=None, started_at=None)

    return change


def unclaimed() -> Change:
    """Give a claimed task back before it starts (this backend became short of room while the claim waited):
    the queue holds it again as it was, for a backend with room."""

    def change(task: Task) -> Task | None:
        return task if task.status == Status.PENDING else None

    return change


def cancel(ttl_sec: float) -> Change:
    def change(task: Task) -> Task | None:
        if task.status not in ACTIVE:
            return None
        return finish(Status.CANCELLED, ttl_sec=ttl_sec)(task)

    return change


def rerun(expected_attempt: int, overrides: dict[str, Any]) -> Change:
    """Start a finished TIMEOUT (or retryable FAILED) task again under the same id."""

    def change(task: Task) -> Task | None:
        if task.attempt != expected_attempt or not rerunnable(task):
            return None
        attempt = task.attempt + 1
        return _next(task, status=Status.PENDING, attempt=attempt, base_attempt=attempt, reruns=task.reruns + 1,
                     progress=0, current_step=None, started_at=None, finished_at=None, expire_at=None, result=None,
                     error=None, **overrides)

    return change


def rerunnable(task: Task) -> bool:
    return rerun_cause(task.status, task.error) is not None
