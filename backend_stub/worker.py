"""Workers: claim a task from the queue, run its export in a thread, and supervise it.

The supervisor coroutine owns everything that is not rendering rows: it writes
progress, renews the lease, notices a cancel, and enforces the timeout. On a
timeout it marks the task and frees itself at once; the thread stops at its next
safe point and removes its partial file.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from backend_stub import lifecycle
from backend_stub.config import BackendConfig
from backend_stub.export_job import Cancelled, ExportJob, JobResult, TransientFailure
from backend_stub.files import ResultFiles
from backend_stub.models import COMPLETED, FAILED, RUNNING, TIMEOUT, Task, error_info
from backend_stub.result_store import ResultStore, StoreUnavailable, object_key
from backend_stub.store import Change, Lease, TaskStore
from exports_common.jsonlog import task_id_var, trace_id_var

log = logging.getLogger("backend.worker")


class Workers:
    def __init__(self, config: BackendConfig, store: TaskStore, files: ResultFiles, results: ResultStore) -> None:
        self.config = config
        self.store = store
        self.files = files
        self.results = results
        # spare threads: a timed-out job may still be finishing its last chunk
        self.executor = ThreadPoolExecutor(max_workers=config.workers * 2, thread_name_prefix="export")
        self._loops: list[asyncio.Task[None]] = []
        self._consumer = f"{socket.gethostname()}-{os.getpid()}"

    async def start(self) -> None:
        self._loops = [asyncio.create_task(self._loop(f"{self._consumer}-{i}")) for i in range(self.config.workers)]

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _loop(self, consumer: str) -> None:
        while True:
            try:
                lease = await self.store.claim(consumer, self.config.lease_sec, wait_sec=1.0)
                if lease is not None:
                    await self._handle(lease, consumer)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker loop error; retrying in 1 s (is the store reachable?)")
                await asyncio.sleep(1.0)

    async def _handle(self, lease: Lease, consumer: str) -> None:
        token = task_id_var.set(lease.task_id)
        trace_token = trace_id_var.set(None)
        try:
            task = await self._begin(lease)
            if task is not None:
                traceparent = task.extra.get("traceparent", "")
                trace_id_var.set(traceparent.split("-")[1] if traceparent.count("-") == 3 else None)
                await self._run(task, lease, consumer)
        finally:
            task_id_var.reset(token)
            trace_id_var.reset(trace_token)

    async def _begin(self, lease: Lease) -> Task | None:
        current = await self.store.get(lease.task_id)
        spec = self.config.export_types.get(current.export_type) if current else None
        if current is None or spec is None:
            await self.store.ack(lease)
            return None
        task, changed = await self.store.update(lease.task_id, lifecycle.begin(spec.max_attempts))
        if task is None or not changed or task.status != RUNNING:
            await self.store.ack(lease)
            return None
        self.files.remove_partials(task.task_id)
        log.info("task started", extra={"attempt": task.attempt, "export_type": task.export_type})
        return task

    def _should_fail(self, task: Task) -> bool:
        fault = self.config.export_types[task.export_type].fault
        used = task.attempt - task.base_attempt + 1
        return used <= fault.fail_first_attempts or random.random() < fault.failure_rate

    async def _run(self, task: Task, lease: Lease, consumer: str) -> None:
        spec = self.config.export_types[task.export_type]
        job = ExportJob(
            spec, task.filters, task.format,
            part_path=self.files.partial(task.task_id, task.attempt),
            publish=self._publisher(object_key(task.task_id, task.format)),
            fail_transiently=self._should_fail(task),
        )
        future = asyncio.get_running_loop().run_in_executor(self.executor, job.run)
        deadline = (task.started_at or time.time()) + task.timeout_sec
        while not future.done():
            remaining = deadline - time.time()
            if remaining <= 0:
                job.cancel()
                await self._end(task, lease, lifecycle.finish(
                    TIMEOUT, attempt=task.attempt, ttl_sec=self.config.task_ttl_sec,
                    error=error_info("TASK_TIMEOUT", f"the export did not finish within {task.timeout_sec} s",
                                     retryable=True)))
                return
            await asyncio.wait({future}, timeout=min(self.config.progress_interval_sec, remaining))
            if future.done():
                break
            current, _ = await self.store.update(task.task_id, lifecycle.report(task.attempt, job.progress, job.step))
            if current is None or current.status != RUNNING or current.attempt != task.attempt:
                job.cancel()
                await asyncio.gather(future, return_exceptions=True)
                log.info("task stopped at a safe point", extra={"status": current.status if current else None})
                await self.store.ack(lease)
                return
            await self.store.renew(lease, consumer)
        await self._complete(task, lease, future)

    def _publisher(self, key: str) -> Callable[[Path], None]:
        """The job's store step, called from its thread: the upload runs on this event loop."""
        loop = asyncio.get_running_loop()

        def publish(path: Path) -> None:
            asyncio.run_coroutine_threadsafe(self.results.publish(path, key), loop).result()
        return publish

    async def _complete(self, task: Task, lease: Lease, future: asyncio.Future[JobResult]) -> None:
        spec = self.config.export_types[task.export_type]
        ttl = self.config.task_ttl_sec
        try:
            result = future.result()
        except TransientFailure as exc:
            if task.attempt - task.base_attempt + 1 < spec.max_attempts:
                log.warning("transient failure; re-queued", extra={"attempt": task.attempt, "error": str(exc)})
                await self.store.update(task.task_id, lifecycle.requeue(task.attempt), enqueue=True, ack=lease)
                return
            change = lifecycle.finish(FAILED, attempt=task.attempt, ttl_sec=ttl, error=error_info(
                "EXPORT_FAILED", f"failed {spec.max_attempts} times; last error: {exc}", retryable=False))
        except Cancelled:
            await self.store.ack(lease)
            return
        except Exception as exc:
            log.exception("export crashed")
            change = lifecycle.finish(FAILED, attempt=task.attempt, ttl_sec=ttl, error=error_info(
                "EXPORT_ERROR", f"the export stopped on an unexpected error: {type(exc).__name__}", retryable=False))
        else:
            change = lifecycle.finish(COMPLETED, attempt=task.attempt, ttl_sec=ttl, result={
                "download_url": f"/exports/{task.task_id}/file",
                "rows": result.rows, "bytes": result.bytes, "format": task.format,
            })
        await self._end(task, lease, change)

    async def _end(self, task: Task, lease: Lease, change: Change) -> None:
        final, changed = await self.store.update(task.task_id, change, ack=lease)
        if not changed:
            # someone else decided first (a cancel, or another worker took over): keep nothing of ours
            await self.store.ack(lease)
            if final is None or final.status != COMPLETED:
                await self._discard(object_key(task.task_id, task.format))
        log.info("task ended", extra={"status": final.status if final else None, "attempt": task.attempt})

    async def _discard(self, key: str) -> None:
        try:
            await self.results.delete(key)
        except StoreUnavailable as exc:
            log.warning("could not delete a result nobody will serve; the expiry sweep deletes it with the task",
                        extra={"key": key, "error": str(exc)})
