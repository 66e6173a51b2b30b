"""The task and export-type shapes the gateway answers with, as plain dataclasses.

Dataclasses keep httpx the SDK's only dependency; a test compares these fields with
the gateway's live `/openapi.json`, so the task contract keeps a single source.
Unknown fields are ignored, so a gateway that adds one does not break old clients.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# the server's contract (exports_common.contract) restated, as the SDK imports nothing of the server's;
# a test compares both with the live /openapi.json
STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
TERMINAL = frozenset(STATUSES[2:])


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class Result:
    download_url: str
    expire_at: str
    rows: int
    bytes: int
    format: str
    compression: str | None = None


@dataclass(frozen=True)
class TaskError:
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True)
class CallbackState:
    state: str
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class Task:
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

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        fields = _known(cls, data)
        for name, kind in (("result", Result), ("error", TaskError), ("callback", CallbackState)):
            if isinstance(fields.get(name), dict):
                fields[name] = kind(**_known(kind, fields[name]))
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExportType:
    export_type: str
    filters_schema: dict[str, Any]
    formats: list[str]
    compression: str | None = None
    max_attempts: int | None = None
    estimated_completion_sec: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportType:
        return cls(**_known(cls, data))
