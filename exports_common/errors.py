"""Every error kind the public API and the backend can answer with.

The numeric codes are part of the contract: they are stable, listed in docs/reference/errors.md
(generated from this module: python -m scripts.gen_reference), and never reused for another meaning
(a retired code stays in RETIRED).
"""
from __future__ import annotations

import math
from enum import Enum
from typing import Any


class ErrorKind(Enum):
    # value: (envelope code, HTTP status, default message)
    BAD_REQUEST = (40000, 400, "the request could not be read")
    INVALID_JSON = (40001, 400, "the body is not valid JSON")
    BAD_RANGE = (40002, 400, "the Range header cannot be read; send 'Range: bytes=<first>-<last>'")
    UNAUTHORIZED = (40100, 401, "send a valid API key as 'Authorization: Bearer <key>'")
    BAD_SIGNATURE = (40300, 403, "the download link's signature is wrong; ask for the task again to get a fresh link")
    NOT_FOUND = (40400, 404, "no such resource")
    TASK_NOT_FOUND = (40401, 404, "no such task (unknown, expired, or not yours)")
    METHOD_NOT_ALLOWED = (40500, 405, "method not allowed on this path")
    REQUEST_TIMEOUT = (40800, 408, "the request was not sent in time")
    TASK_ID_CONFLICT = (40901, 409, "a task with this id exists with a different payload")
    IDEMPOTENCY_IN_FLIGHT = (40902, 409, "a request with this Idempotency-Key is still in flight; retry shortly")
    STALE_ATTEMPT = (40903, 409, "expected_attempt does not match the task's current attempt")
    TASK_TERMINAL = (40904, 409, "the task has already finished")
    NOT_RETRYABLE = (40905, 409, "the task is not in a state that can be re-run")
    GONE = (41000, 410, "the download link has expired; poll the task for a fresh link")
    FILE_GONE = (41001, 410, "the result file has expired")
    RESULT_LOST = (41002, 410, "the task's result file is no longer in the result store although the task has "
                   "not expired (the store lost it); submit the export again")
    PAYLOAD_TOO_LARGE = (41300, 413, "the request body is too large")
    UNSUPPORTED_MEDIA_TYPE = (41500, 415, "send the body as 'Content-Type: application/json'")
    RANGE_NOT_SATISFIABLE = (41600, 416, "the requested range starts past the end of the file; see Content-Range")
    HEADERS_TOO_LARGE = (43100, 431, "the request headers are too large")
    VALIDATION = (42200, 422, "the request is invalid")
    IDEMPOTENCY_KEY_REUSED = (42201, 422, "this Idempotency-Key was used with a different body; use a new key")
    RATE_LIMITED = (42900, 429, "too many requests; retry after the time in Retry-After")
    TOO_MANY_ACTIVE_TASKS = (42901, 429, "too many active tasks; wait for some to finish or cancel some")
    OUTBOX_FULL = (42902, 429, "too many submissions are waiting for the export service; retry later")
    TOO_MANY_STREAMS = (42903, 429, "too many event streams open for this tenant; close some, or retry after "
                                    "the time in Retry-After")
    IDEMPOTENCY_QUOTA = (42910, 429, "this tenant holds its maximum number of Idempotency-Keys; retry after "
                                     "older ones expire (Retry-After), or submit without the header")
    INTERNAL = (50000, 500, "internal error; the request was not applied, retry later")
    UPSTREAM_UNREACHABLE = (50200, 502, "the upstream service could not be reached; retry later")
    UNAVAILABLE = (50300, 503, "the service is temporarily unavailable; retry after the time in Retry-After")
    UPSTREAM_TIMEOUT = (50400, 504, "the upstream service did not answer in time; retry later")

    @property
    def code(self) -> int:
        return self.value[0]

    @property
    def status(self) -> int:
        return self.value[1]

    @property
    def default_message(self) -> str:
        return self.value[2]


# what the reference page adds to a code's default message: when it is answered and what `data` holds
DETAILS: dict[ErrorKind, str] = {
    ErrorKind.VALIDATION: "`data.field` names the field, `data.reason` says what is wrong with it",
    ErrorKind.REQUEST_TIMEOUT: "request headers not complete within `header_timeout_sec`; the connection is closed",
    ErrorKind.TASK_ID_CONFLICT: "answered by the backend to a submit under a task id it already holds",
    ErrorKind.STALE_ATTEMPT: "backend re-run: `expected_attempt` is not the current attempt",
    ErrorKind.TASK_TERMINAL: "cancel of a finished task; the task is in `data`",
    ErrorKind.NOT_RETRYABLE: "re-run of a task that is not TIMEOUT or retryable FAILED",
    ErrorKind.FILE_GONE: "the task expired: its file is deleted or about to be",
    ErrorKind.RESULT_LOST: "download: the task has not expired but the result store no longer has its file (lost "
                           "with the store's data, deleted behind the backends' backs, or backends on different "
                           "stores)",
    ErrorKind.RANGE_NOT_SATISFIABLE: "`Content-Range: bytes */<size>` gives the file's size",
    ErrorKind.HEADERS_TOO_LARGE: "over `max_header_bytes` or `connection_limits.max_headers` lines",
    ErrorKind.METHOD_NOT_ALLOWED: "`Allow` lists the allowed methods",
    ErrorKind.RATE_LIMITED: "`data.limit`: `requests`, `submits` or `address`; `Retry-After` and `RateLimit` "
                            "headers say when",
    ErrorKind.TOO_MANY_ACTIVE_TASKS: "the tenant has `max_active_tasks` PENDING or RUNNING (`data.active`, "
                                     "`data.limit`)",
    ErrorKind.OUTBOX_FULL: "the tenant has `max_outbox_entries` submits waiting in the outbox for the backend",
    ErrorKind.TOO_MANY_STREAMS: "the tenant has `max_open_streams` event streams open (over every gateway with "
                                "Redis); `RateLimit-Policy: \"streams\";q=<cap>` comes with it",
    ErrorKind.INTERNAL: "a bug; nothing was applied (never caused by client input)",
    ErrorKind.UPSTREAM_UNREACHABLE: "the upstream refused or reset the connection, or answered what the gateway "
                                    "will not pass on: `data.reason: answer_too_large` for an answer read whole past "
                                    "the route's `max_answer_bytes`, a transfer coding other than `chunked`",
    ErrorKind.UNAVAILABLE: "upstream breaker open, nothing known to degrade to, shared state (Redis) unreachable "
                           "(`data.reason: store_unavailable`), or not ready",
    ErrorKind.UPSTREAM_TIMEOUT: "the upstream did not answer within the timeouts (an answer read whole counts to "
                                "its last byte), or the request had no answer within its route's "
                                "`first_byte_timeout_sec` (`data.reason: deadline`)",
    ErrorKind.BAD_RANGE: "a range whose last byte comes before its first (`bytes=5-1`) is invalid and ignored "
                         "instead: the whole file, 200 (RFC 9110)",
}

# codes no longer answered, never to be given another meaning: code -> (name, HTTP status, why)
RETIRED: dict[int, tuple[str, int, str]] = {
    50001: ("RESULT_MISSING", 500, "retired in 0.2.0: a missing file is RESULT_LOST (41002) now"),
}


class ApiError(Exception):
    """Raised anywhere in a request; turned into an envelope at the edge of the app."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str | None = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or kind.default_message)
        self.kind = kind
        self.message = message or kind.default_message
        self.data = data
        self.headers = headers or {}


def validation_error(field: str, reason: str) -> ApiError:
    return ApiError(ErrorKind.VALIDATION, f"{field}: {reason}", data={"field": field, "reason": reason})


def unavailable(why: str, retry_after_sec: float, data: Any = None) -> ApiError:
    """503 with `Retry-After` in whole seconds (at least 1), and the wait named in the message."""
    seconds = str(max(1, math.ceil(retry_after_sec)))
    return ApiError(ErrorKind.UNAVAILABLE, f"{why}; retry after {seconds} s", data=data,
                    headers={"Retry-After": seconds})
