"""The task and export-type shapes the gateway answers with, as plain dataclasses.

Dataclasses keep httpx the SDK's only dependency; a test compares these fields with
the gateway's live `/openapi.json`, so the task contract keeps a single source.

A newer gateway may answer more than this SDK knows: a field it does not name lands
in `extra` (and `to_dict()` gives it back), and an unknown status or format is kept
as the string the gateway sent, so an old client keeps working against a new server.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Self

# the server's contract (exports_common.contract) restated, as the SDK imports nothing of the server's;
# a test compares them with the live /openapi.json
STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
TERMINAL = frozenset(STATUSES[2:])
IN_PROGRESS = frozenset(STATUSES[:2])


@dataclass(frozen=True)
class Model:
    """A shape of the API: its known fields, plus `extra` for the ones a newer gateway added."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, hash=False)

    @classmethod
    def split(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's arguments: the known fields by name, the rest gathered in `extra`."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return {**{k: v for k, v in data.items() if k in names},
                "extra": {k: v for k, v in data.items() if k not in names}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls(**cls.split(data))

    def to_dict(self) -> dict[str, Any]:
        """The fields as the gateway sent them, unknown ones included."""
        known = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v.to_dict() if isinstance(v, Model) else v for k, v in known.items()}, **self.extra}


@dataclass(frozen=True)
class Result(Model):
    download_url: str
    expire_at: str
    rows: int
    bytes: int
    format: str
    compression: str | None = None


@dataclass(frozen=True)
class TaskError(Model):
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True)
class CallbackState(Model):
    state: str
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class Task(Model):
    task_id: str
    status: str
    export_type: str | None = None
    progress: int = 0
    current_step: str | None = None
    attempt: int = 1
    created_at: str = ""
    updated_at: str = ""
    result: Result | None = None
    error: TaskError | None = None
    degraded: bool = False
    callback: CallbackState | None = None
    reruns: int | None = None
    format: str | None = None
    timeout_sec: int | None = None
    estimated_completion_sec: int | None = None
    change_id: str | None = None

    @property
    def terminal(self) -> bool:
        """One of the final statuses this SDK knows (a newer gateway's own status is neither this nor running)."""
        return self.status in TERMINAL

    @property
    def running(self) -> bool:
        return self.status in IN_PROGRESS

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        fields = cls.split(data)
        for name, kind in (("result", Result), ("error", TaskError), ("callback", CallbackState)):
            if isinstance(fields.get(name), dict):
                fields[name] = kind.from_dict(fields[name])
        return cls(**fields)


@dataclass(frozen=True)
class ExportType(Model):
    export_type: str
    filters_schema: dict[str, Any]
    formats: list[str]
    compression: str | None = None
    max_attempts: int | None = None
    estimated_completion_sec: int | None = None
