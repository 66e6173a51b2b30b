"""The storage interface: task records plus an at-least-once queue with leases.

Every state change goes through `update`, which applies a pure function to the
current record atomically (a transaction in SQLite, WATCH/MULTI in Redis), so the
API, workers and the janitor never overwrite each other's changes.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Callable, Protocol

from backend_stub.models import Task
from exports_common.contract import DeliveryState

# Returns the new record, or None to leave the task as it is.
Change = Callable[[Task], "Task | None"]


@dataclass(frozen=True)
class Lease:
    """A claimed queue entry; the worker holding it renews it until it acks."""

    entry_id: str
    task_id: str
    lease_sec: float
    owner: str  # the consumer that claimed it: only its holder may ack it


class TaskStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create(self, task: Task) -> tuple[Task, bool]:
        """Insert and enqueue the task, or return the existing one with that id (created=False)."""

    async def get(self, task_id: str) -> Task | None: ...

    async def active_count(self, tenant: str) -> int:
        """How many of the tenant's tasks are not terminal (PENDING or RUNNING)."""

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None
    ) -> tuple[Task | None, bool]:
        """Apply `change` atomically; optionally enqueue the task again and ack a lease in the same step.

        Returns (the record as it now is or None if missing, whether it changed).
        """

    async def list_tasks(
        self, tenant: str, status: str | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]: ...

    async def claim(self, consumer: str, lease_sec: float, wait_sec: float) -> Lease | None:
        """The next task in fair turn (backend_stub.store.fair), leased to `consumer`; None after `wait_sec`."""

    async def renew(self, lease: Lease, consumer: str) -> None:
        """Extend the lease by its length from now."""

    async def ack(self, lease: Lease) -> None:
        """Remove the entry, if `lease.owner` still holds it; its tenant has one running task fewer."""

    async def expired(self, now: float, limit: int) -> list[str]: ...

    async def due_callbacks(self, now: float, limit: int) -> list[str]:
        """Tasks with a callback delivery due by `now`, soonest first."""

    async def delete(self, task_id: str) -> None: ...

    async def task_counts(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """({(tenant, status): tasks}, {tenant: created_at of its oldest PENDING task}), for the metrics."""

    async def ping(self) -> bool: ...


def callback_due(task: Task) -> float | None:
    cb = task.callback
    return cb.get("next_at") if cb is not None and cb.get("state") == DeliveryState.PENDING else None


def encode_cursor(created_at: float, task_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at, task_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """Raises ValueError on anything that is not a cursor this store made."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, task_id = json.loads(raw)
        return float(created_at), str(task_id)
    except Exception as exc:  # any garbage a client sends is one kind of error to them
        raise ValueError("not a cursor returned by this API") from exc
