"""The storage interface: task records, an at-least-once queue with leases, a change log and delivery claims.

Every state change goes through `update`, which applies a pure function to the
current record atomically (a transaction in SQLite, WATCH/MULTI in Redis), so the
API, workers and the janitor never overwrite each other's changes. The same atomic
step appends the change to the store's change log (what push consumers follow), and
a callback's outcome is written only by the holder of that delivery's claim.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Callable, Protocol

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


@dataclass(frozen=True)
class ChangeEntry:
    """One entry of the change log: a task as a client saw it right after one of its changes."""

    change_id: str  # opaque; the ids of one store compare as strings in log order (see TaskStore.changes)
    task_id: str
    tenant: str
    task: dict[str, Any]  # the record as the status endpoint answers it (`Task.public()`), so no read is needed

    def __post_init__(self) -> None:
        # the view was written in the same step as the entry, before its id was known: it carries this one
        self.task["change_id"] = self.change_id


class ChangeLogGap(Exception):
    """`after` is not in the log any more: entries after it were trimmed (older than the retention), or the
    log never issued it (a store that lost its data). The caller falls back to the current state of the
    tasks it follows and continues after `latest_change_id()` read before that."""


@dataclass(frozen=True)
class DeliveryClaim:
    """The right to deliver notification `seq` of a task's callback, held by `holder` until its lease ends."""

    task_id: str
    seq: int
    holder: str
    task: Task  # the record as it was when the claim was taken: what to deliver
    taken_over: bool  # a previous holder's claim had run out without an outcome (it died mid-delivery)


class TaskStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create(self, task: Task) -> tuple[Task, bool]:
        """Insert and enqueue the task, or return the existing one with that id (created=False)."""

    async def get(self, task_id: str) -> Task | None: ...

    async def active_count(self, tenant: str) -> int:
        """How many of the tenant's tasks are not terminal (PENDING or RUNNING)."""

    async def update(
        self, task_id: str, change: Change, *, enqueue: bool = False, ack: Lease | None = None,
        claim: DeliveryClaim | None = None,
    ) -> tuple[Task | None, bool]:
        """Apply `change` atomically; optionally enqueue the task again and ack a lease in the same step.

        With `claim` (a delivery's outcome), the change applies only while the store's claim on the task
        is still that one (same holder, same seq), and the claim is released in the same step: a holder
        whose claim ran out and was taken over changes nothing (returns the record and False).
        A change appends its entry to the change log in the same step (see `changes`), and the record
        returned carries that entry's id as `change_id`.

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
        """Tasks with a callback delivery due by `now`, soonest first; one under a live claim is not due."""

    async def claim_callback(self, task_id: str, holder: str, lease_sec: float) -> DeliveryClaim | None:
        """Claim the delivery of the task's pending notification (its current `callback_seq`) for `holder`.

        Atomically: the task has a PENDING notification that is due, and no live claim is held on the
        task by anyone else; then the claim is recorded with a lease of `lease_sec` (on the store's
        clock) and the delivery stops being due until the lease ends. Otherwise None: another process
        delivers it, or it is not due. So one notification is delivered by one holder at a time, once
        per state change; only a holder that stops before recording the outcome (its lease runs out)
        lets another take the delivery over and send it again (`taken_over`). The lease must outlast a
        delivery try. The same holder asking again for the same seq gets its claim again (a retried call).
        The outcome is written with `update(..., claim=...)`, which releases the claim.
        """

    async def changes(self, after: str | None, limit: int, wait_sec: float = 0.0) -> list[ChangeEntry]:
        """Up to `limit` change-log entries with ids after `after` (None: from the oldest entry kept), oldest first.

        Every change of a task record (create, and every `update` that changes it: status, progress,
        current_step, attempt, result, error, callback state, ...) appends one entry in the same atomic
        step as the change itself; a deleted task appends none. Guarantees:
        - Ids increase in the order readers can see them: a reader that has seen id X never later sees a
          new entry with an id <= X, so reading on from the last id seen misses nothing. Ids are opaque
          strings of one fixed length per store that compare as strings in log order, so a consumer can
          drop an entry older than a state it already has (`Task.change_id`).
          An implementation must make the id order the commit order. SQLite (one writer at a time) and
          Redis (a stream appended in the same MULTI/script as the record) get this by construction. On
          PostgreSQL or MariaDB a sequence or AUTO_INCREMENT is NOT commit-ordered (a transaction holding
          id 10 may commit after one holding 11, and a reader that saw 11 would skip 10): either assign
          the id under a lock held to commit (e.g. UPDATE a one-row counter in the same transaction), or
          record each entry's transaction id and let readers stop before the oldest transaction still in
          progress (PostgreSQL: pg_current_xact_id() with pg_snapshot_xmin(pg_current_snapshot())).
        - Entries are kept at least the retention (`change_log.retention_sec`, at least 600 s); older
          ones are trimmed by `trim_changes`. An `after` whose successors were trimmed, or one this log
          never issued (the store lost its data), raises ChangeLogGap; a string that is not an id of this
          store raises ValueError (a client error).
        - With `wait_sec` > 0 and nothing after `after`, the call waits up to `wait_sec` for an entry,
          woken by the write (no busy polling), and returns [] if none came.
        - Memory is bounded by `limit` (at least 1, else ValueError): a consumer reads on page by page.
        """

    async def latest_change_id(self) -> str | None:
        """The id of the newest entry the log issued (None: none yet): read it before a current state to
        follow the changes after that state without a gap."""

    async def trim_changes(self) -> int:
        """Drop entries older than the retention; returns how many. The janitor calls it every sweep."""

    async def change_log_stats(self) -> tuple[int, float | None]:
        """(entries kept, age in seconds of the oldest or None when empty), for the metrics."""

    async def delete(self, task_id: str) -> None: ...

    async def task_counts(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """({(tenant, status): tasks}, {tenant: created_at of its oldest PENDING task}), for the metrics."""

    async def ping(self) -> bool: ...

    async def put_type_definition(self, digest: str, definition: str) -> None:
        """Keep an export type's definition (JSON, as written in the file) under its digest, and note the time
        (the store's clock) as its last recording; the same digest always holds the same text, so a second put
        only moves that time."""

    async def drop_unused_type_definitions(self, recorded_before: float) -> int:
        """Remove the definitions last recorded before `recorded_before` that no task names (`type_digest`);
        returns how many. A task is created right after its definition is recorded (`put_type_definition`), so
        a cut-off well before now never removes one a task being created is about to name."""

    async def type_definition(self, digest: str) -> str | None:
        """The definition kept under `digest`, or None."""


def callback_due(task: Task) -> float | None:
    cb = task.callback
    return cb.get("next_at") if cb is not None and cb.get("state") == DeliveryState.PENDING else None


def page_size(limit: int) -> int:
    """A change-log read's `limit`; below 1 a reader would never move on (ValueError: a client error)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    return limit


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
