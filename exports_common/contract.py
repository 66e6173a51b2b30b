"""The task contract every part shares: statuses, output formats, the public task, re-runs, signed links.

The backend answers with these models, the gateway's outbox answers with them for a
task still waiting, and /openapi.json is generated from them, so the shape a client
sees is written down once, here. (The SDK keeps its own dataclasses to stay
dependency-free; a test compares them with the live document.)
"""
from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from exports_common.signing import DownloadSigner
from exports_common.task_ids import TASK_ID_PATTERN


class Status(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"


STATUSES = tuple(s.value for s in Status)  # for membership tests of any JSON value (a tuple compares, never hashes)
ACTIVE = frozenset({Status.PENDING, Status.RUNNING})
TERMINAL = frozenset(Status) - ACTIVE


# An output format's name, as a submit asks for it: each export type lists the formats it offers (csv,
# jsonl, parquet, raw, ...) and the backend refuses one its type does not, so every other part of the
# system checks only this shape and never a fixed list.
FORMAT_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
FormatName = Annotated[str, Field(pattern=f"^{FORMAT_PATTERN.pattern}$", description=(
    "an output format the export type offers (GET /api/v1/export-types lists them)"))]
# the media types a result file is served with: one per format the backends write, and gzip for a
# compressed file (served as is, without Content-Encoding)
RESULT_MEDIA_TYPES = ("text/csv", "application/x-ndjson", "application/gzip")


class DeliveryState(StrEnum):
    """Where a task's callback notification stands."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


RerunCause = Literal["TIMEOUT", "FAILED_RETRYABLE"]


def rerun_cause(status: str, error: dict[str, Any] | None) -> RerunCause | None:
    """Why a finished task may be started again under its id: it ran out of time, or failed retryably."""
    if status == Status.TIMEOUT:
        return "TIMEOUT"
    if status == Status.FAILED and error is not None and error.get("retryable"):
        return "FAILED_RETRYABLE"
    return None


# -- the public task, as every API answer carries it ------------------------------------------------

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
Count = Annotated[int, Field(ge=0)]


class _View(BaseModel):
    # no `extra="forbid"`: the document must not tell clients to refuse fields a later version adds
    model_config = ConfigDict(frozen=True)


class Result(_View):
    download_url: str
    expire_at: Timestamp
    rows: Count
    bytes: Count = Field(description="the stored file's size (compressed, when it is)")
    format: FormatName
    compression: str | None = Field(None, description="gzip: the file is gzip-compressed (<task_id>.csv.gz)")


class TaskError(_View):
    code: str
    message: str
    retryable: bool


class CallbackState(_View):
    state: DeliveryState
    attempts: Count
    last_error: str | None


# set on every task the backend knows; a task still waiting in the gateway's outbox lacks them
_OMITTED_WHEN_UNKNOWN = ("reruns", "format", "timeout_sec", "estimated_completion_sec", "change_id")


class Task(_View):
    task_id: Annotated[str, Field(pattern=TASK_ID_PATTERN.pattern)]
    export_type: str | None
    status: Status
    progress: Annotated[int, Field(ge=0, le=100)]
    current_step: str | None
    attempt: Annotated[int, Field(ge=1)]
    created_at: Timestamp
    updated_at: Timestamp
    result: Result | None
    error: TaskError | None
    degraded: bool
    callback: CallbackState | None
    reruns: Count | None = None
    format: FormatName | None = None
    timeout_sec: Annotated[int, Field(ge=1)] | None = None
    estimated_completion_sec: Count | None = Field(None, description="on a new task: the expected run time")
    change_id: str | None = Field(None, description="the id of the task's latest change in the backend's change "
                                  "log (opaque): an event stream resumes after it (`Last-Event-ID`)")

    def answer(self) -> dict[str, Any]:
        """The task as an API answer's `data` (a field not known is left out rather than null)."""
        unknown = {name for name in _OMITTED_WHEN_UNKNOWN if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=unknown)


class ExportType(_View):
    export_type: str
    filters_schema: dict[str, Any] = Field(description="JSON Schema of this type's filters")
    formats: list[FormatName] = Field(description="the formats a submit may ask for; the first is the default")
    compression: str | None = Field(None, description="gzip: this type's files are gzip-compressed")
    max_attempts: Annotated[int, Field(ge=1)] | None = None
    estimated_completion_sec: Count | None = None


PUBLIC_MODELS: tuple[type[BaseModel], ...] = (Task, Result, TaskError, CallbackState, ExportType)


# -- signed download links ------------------------------------------------------------------------

DOWNLOAD_PATH = "/api/v1/exports/{task_id}/download"
_EXPIRES = re.compile(r"[0-9]{1,12}")  # unix seconds: 12 digits reach the year 33658


def signed_link(signer: DownloadSigner, base: str, task_id: str, result_expires: float,
                path: str = DOWNLOAD_PATH) -> str:
    """`<base><path>?expires=<unix>&sig=<hmac>`: the link expires with the result, or sooner at the signer's cap."""
    expires = signer.expiry(result_expires)
    return f"{base}{path.format(task_id=task_id)}?expires={expires}&sig={signer.sign(task_id, expires)}"


def link_params(params: list[tuple[str, str]]) -> tuple[int | None, str | None]:
    """A link's `expires` (ASCII digits, at most 12) and `sig`, each given once; None for anything else.

    Every malformed link is the same refusal as a wrong signature: the link is the credential.
    """
    found: dict[str, list[str]] = {}
    for name, value in params:
        found.setdefault(name, []).append(value)
    expires, sig = found.get("expires", []), found.get("sig", [])
    ok_expires = len(expires) == 1 and _EXPIRES.fullmatch(expires[0]) is not None
    return (int(expires[0]) if ok_expires else None), (sig[0] if len(sig) == 1 else None)


# `error.code` of a FAILED or TIMEOUT task, with what it means (docs/reference/errors.md is generated from it)
TASK_ERROR_CODES: dict[str, str] = {
    "TASK_TIMEOUT": "the task ran past its timeout; retryable (a re-run may be asked for)",
    "EXPORT_FAILED": "transient failures used all of the type's `max_attempts`; not retryable",
    "EXPORT_TOO_LARGE": "past the type's `max_rows` or `max_bytes`; not retryable",
    "SOURCE_ERROR": "the source yielded a row that does not match its columns; not retryable",
    "FORMAT_UNAVAILABLE": "the backend no longer writes the task's format; not retryable",
    "EXPORT_ERROR": "the export stopped on an unexpected error",
    "WORKER_LOST": "the worker running the task died on its last allowed attempt",
    "SUBMIT_REFUSED_<code>": "a submit the gateway held in its outbox while the backend was down was then refused by "
                             "the backend for good; `<code>` is the backend's error code (e.g. "
                             "`SUBMIT_REFUSED_42200`) and the message carries its message; not retryable: submit "
                             "again as the message says",
}
