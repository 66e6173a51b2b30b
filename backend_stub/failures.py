"""How an export attempt ends without a file: what a source, a writer or the job itself may raise.

The worker turns each into the task's next state: `Cancelled` keeps whatever state the
canceller wrote, `DeadlineReached` is TIMEOUT, `TransientFailure` is another attempt
(until the type's `max_attempts`), `PermanentFailure` is FAILED at once, not retryable.
"""
from __future__ import annotations


class Cancelled(Exception):
    """The job was told to stop (a cancel, the supervisor's timeout, or a lost lease)."""


class DeadlineReached(Cancelled):
    """The job itself saw the task's deadline pass between two batches."""


class TransientFailure(Exception):
    """A failure worth another attempt: a source that could not be reached, a store that failed, an injected fault.

    `wait_sec`: the next attempt must not start sooner (an endpoint's Retry-After, a backoff); the attempt
    waits it out before it ends, when another attempt is left."""

    def __init__(self, message: str, wait_sec: float = 0.0) -> None:
        super().__init__(message)
        self.wait_sec = wait_sec


class PermanentFailure(Exception):
    """A failure another attempt would repeat; `code` and the message are what the task's error says."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
