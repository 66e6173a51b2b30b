"""Deletes terminal tasks and their files once their TTL has passed."""
from __future__ import annotations

import asyncio
import logging
import time

from backend_stub import metrics
from backend_stub.files import ResultFiles
from backend_stub.store import TaskStore

log = logging.getLogger("backend.janitor")
BATCH = 500


async def sweep_once(store: TaskStore, files: ResultFiles) -> int:
    removed = 0
    while task_ids := await store.expired(time.time(), BATCH):
        for task_id in task_ids:
            files.remove_all(task_id)
            await store.delete(task_id)
        removed += len(task_ids)
        metrics.janitor_deletions.inc(len(task_ids))
        if len(task_ids) < BATCH:
            break
    return removed


async def run(store: TaskStore, files: ResultFiles, interval_sec: float) -> None:
    while True:
        try:
            removed = await sweep_once(store, files)
            if removed:
                log.info("expired tasks removed", extra={"count": removed})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("expiry sweep failed; will try again next interval")
        await asyncio.sleep(interval_sec)
