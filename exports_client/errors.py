"""Typed errors: every refusal carries the gateway's envelope (`code`, `message`, `data`)."""
from __future__ import annotations

from typing import Any

from exports_client.models import Task


class ExportsError(Exception):
    """Anything the SDK raises."""


class ApiError(ExportsError):
    """The gateway refused the request; `code` is the envelope's stable error code (None without an envelope)."""

    def __init__(self, status: int | None, code: int | None, message: str, data: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status = status
        self.code = code
        self.message = message
        self.data = data
        self.retry_after = retry_after


class NotFound(ApiError):
    """404: the task is unknown, expired, or another client's."""


class RateLimited(ApiError):
    """429 that outlasted the retries; `retry_after` says when to come back."""


class Unavailable(ApiError):
    """503 (or 502/504) that outlasted the retries, or the gateway could not be reached at all (status None)."""


class WaitTimeout(ExportsError):
    """`wait` reached `max_wait` while the task still runs: the task goes on; resume with `resume_token`."""

    def __init__(self, task: Task | None, resume_token: str, waited_sec: float) -> None:
        state = f"{task.status} at {task.progress}%" if task else "not polled yet"
        super().__init__(f"gave up waiting after {waited_sec:.0f} s; the task is {state} and keeps running")
        self.task = task
        self.resume_token = resume_token
        self.waited_sec = waited_sec


class DownloadError(ExportsError):
    """The file could not be fetched whole (not COMPLETED, wrong size, or the transfer kept failing)."""


class WebhookVerificationError(ExportsError):
    """A callback's signature, timestamp or headers do not check out: do not trust its body."""
