"""The task record as the stores keep it; `public()` is its view in the shared contract."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from backend_stub.result_store.base import object_key
from exports_common import contract
from exports_common.contract import TERMINAL, Status
from exports_common.timefmt import rfc3339


@dataclass
class Task:
    task_id: str
    tenant: str
    export_type: str
    filters: dict[str, Any]
    format: str
    timeout_sec: int
    callback_url: str | None
    fingerprint: str
    created_at: float
    updated_at: float
    status: str = Status.PENDING
    progress: int = 0
    current_step: str | None = None
    attempt: int = 1
    # attempts count against max_attempts from here: a re-run starts a fresh allowance
    base_attempt: int = 1
    degraded: bool = False
    reruns: int = 0
    callback_seq: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    expire_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    callback: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # the change-log entry of the record's latest change, set by the store as it writes the record
    change_id: str = ""
    # the type's compression when the task was created: the stored file's name and media type follow it
    compression: str | None = None
    # the digest of the type's definition when the task was created: every attempt and re-run reads it back
    # (backend_stub.registry), so editing or removing the type does not change what this task exports
    type_digest: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def result_key(self) -> str:
        """The result file's name in the result store, which is also the name a download is saved under."""
        return object_key(self.task_id, self.format, self.compression)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def json_around_change_id(self) -> tuple[str, str]:
        """The record's JSON in the two parts that go before and after its change id, for a store that
        learns the id only inside the write itself (Redis: the stream entry's id, in one script)."""
        fields = dataclasses.asdict(self)
        del fields["change_id"]
        return json.dumps(fields, separators=(",", ":"))[:-1] + ',"change_id":"', '"}'

    @classmethod
    def from_json(cls, raw: str | bytes) -> Task:
        return cls(**json.loads(raw))

    def public(self, estimated_completion_sec: int | None = None) -> dict[str, Any]:
        """The task as the API answers it: the contract's model, checked on the way out."""
        result = None
        if self.result is not None:
            result = dict(self.result, expire_at=rfc3339(self.expire_at) if self.expire_at else None)
        callback = {k: self.callback[k] for k in ("state", "attempts", "last_error")} if self.callback else None
        return contract.Task(
            task_id=self.task_id, export_type=self.export_type, status=self.status, progress=self.progress,
            current_step=self.current_step, attempt=self.attempt, created_at=rfc3339(self.created_at),
            updated_at=rfc3339(self.updated_at), result=result, error=self.error, degraded=self.degraded,
            callback=callback, reruns=self.reruns, format=self.format, timeout_sec=self.timeout_sec,
            estimated_completion_sec=estimated_completion_sec, change_id=self.change_id or None,
        ).answer()


def error_info(code: str, message: str, retryable: bool) -> dict[str, Any]:
    return {"code": code, "message": message, "retryable": retryable}
