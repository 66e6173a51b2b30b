"""Deletes terminal tasks and their result objects once their TTL has passed, and trims the change log.

Every backend sweeps the shared task store, so any of them may expire any task: the object
is deleted from the shared result store first and the record only after that, so an outage
of the result store leaves the record (and a later sweep retries) rather than an orphan.
The change log keeps its entries the retention and up to one sweep interval more. Every
DEFINITION_SWEEP_SEC, export types' definitions that no task names any more (their tasks
expired) and that no backend recorded for DEFINITION_GRACE_SEC are removed.
"""
from __future__ import annotations

import logging
import time

from backend_stub import metrics
from backend_stub.registry import RECORD_REFRESH_SEC
from backend_stub.result_store import ResultStore, StoreUnavailable
from backend_stub.store import TaskStore, store_down
from exports_common.periodic import periodic

log = logging.getLogger("backend.janitor")
BATCH = 500
DEFINITION_SWEEP_SEC = 3600.0  # reads every task record (Redis) or its JSON (SQL): seldom
DEFINITION_GRACE_SEC = 2 * RECORD_REFRESH_SEC  # longer than a backend goes without recording one it uses


async def sweep_once(store: TaskStore, results: ResultStore) -> int:
    removed = 0
    while task_ids := await store.expired(time.time(), BATCH):
        for task_id in task_ids:
            task = await store.get(task_id)
            if task is not None:
                await results.delete(task.result_key)
            await store.delete(task_id)
        removed += len(task_ids)
        metrics.janitor_deletions.inc(len(task_ids))
        if len(task_ids) < BATCH:
            break
    return removed


async def drop_unused_definitions(store: TaskStore, now: float) -> int:
    """Remove the definitions no task names that no backend recorded in the grace before `now`."""
    dropped = await store.drop_unused_type_definitions(now - DEFINITION_GRACE_SEC)
    if dropped:
        log.info("unused export type definitions removed", extra={"count": dropped})
    return dropped


EXPECTED: dict[type[Exception], str] = {
    StoreUnavailable: "the result store does not answer; expired tasks are kept until it does: check the "
                      "S3 endpoint and credentials in result_store",
    **store_down("expired tasks are kept"),
}


async def run(store: TaskStore, results: ResultStore, interval_sec: float) -> None:
    definitions_due = time.monotonic()

    async def step() -> None:
        nonlocal definitions_due
        await store.trim_changes()
        removed = await sweep_once(store, results)
        if removed:
            log.info("expired tasks removed", extra={"count": removed})
        if time.monotonic() >= definitions_due:
            await drop_unused_definitions(store, time.time())
            definitions_due = time.monotonic() + DEFINITION_SWEEP_SEC

    await periodic("expiry sweep", step, interval_sec, log, expected=EXPECTED)
