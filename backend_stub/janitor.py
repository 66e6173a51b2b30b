"""Deletes terminal tasks and their result objects once their TTL has passed, and trims the change log.

Every backend sweeps the shared task store, so any of them may expire any task: the object
is deleted from the shared result store first and the record only after that, so an outage
of the result store leaves the record (and a later sweep retries) rather than an orphan.
The change log keeps its entries the retention and up to one sweep interval more.
"""
from __future__ import annotations

import logging
import time

from backend_stub import metrics
from backend_stub.result_store import ResultStore, StoreUnavailable
from backend_stub.store import TaskStore, store_down
from exports_common.periodic import periodic

log = logging.getLogger("backend.janitor")
BATCH = 500


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


EXPECTED: dict[type[Exception], str] = {
    StoreUnavailable: "the result store does not answer; expired tasks are kept until it does: check the "
                      "S3 endpoint and credentials in result_store",
    **store_down("expired tasks are kept"),
}


async def run(store: TaskStore, results: ResultStore, interval_sec: float) -> None:
    async def step() -> None:
        await store.trim_changes()
        removed = await sweep_once(store, results)
        if removed:
            log.info("expired tasks removed", extra={"count": removed})

    await periodic("expiry sweep", step, interval_sec, log, expected=EXPECTED)
