"""Workers: claim a task from the queue, run its export in a thread, and supervise it.

The supervisor coroutine owns everything that is not rendering rows: it writes
progress, renews the lease, notices a cancel, and enforces the timeout. On a
timeout it marks the task and frees itself at once; the thread stops at its next
safe point and removes its partial file.

A store that stalls or drops connections does not end an attempt: the progress,
renewal and final writes are retried for as long as the lease last renewed
still holds. Only when it has really run out (another worker may now have the
task) does the attempt give up: its export stops at the next safe point and its
partial output is removed, and every later write it might make is refused by
the attempt number. So a stall shorter than the lease runs no task twice, and a
dead worker's task runs again exactly once.

A result store outage is waited out by the export itself (backend_stub.export_job)
within the task's timeout, spending no attempt. A backend short of disk space under
its data_dir (backend_stub.disk_space) claims nothing until space is back, and a task
whose file found the disk full goes back to the queue without spending an attempt, for
a backend with room.
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
from typing import Awaitable, TypeVar

from redis.exceptions import RedisError

from backend_stub import lifecycle, metrics, tracing
from backend_stub.config import BackendConfig, ExportTypeConfig
from backend_stub.disk_space import DiskSpace, OutOfSpace
from backend_stub.export_job import ExportJob, JobResult
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure, TransientFailure
from backend_stub.files import ResultFiles
from backend_stub.models import Task, error_info
from backend_stub.registry import Registry
from backend_stub.result_store import ResultStore, StoreUnavailable
from backend_stub.store import Change, Lease, TaskStore, store_down
from exports_common.contract import Status
from exports_common.jsonlog import task_id_var, trace_id_var
from exports_common.periodic import periodic
from exports_common.sql import SqlError

log = logging.getLogger("backend.worker")
STORE_RETRY_SEC = 0.5
T = TypeVar("T")


class LeaseLost(Exception):
    """The store stayed unreachable until this attempt's lease ran out; another worker may have the task."""


class Held:
    """How long this worker's lease surely lasts: its length from the last renewal the store confirmed."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        # a margin for clock reading and the store's own idle accounting
        self.until = time.monotonic() + lease.lease_sec * 0.9

    def renewed(self) -> None:
        self.until = time.monotonic() + self.lease.lease_sec * 0.9

    async def retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run a store call, again and again through connection errors, while the lease holds."""
        while True:
            try:
                return await op()
            except (RedisError, SqlError, OSError) as exc:
                if time.monotonic() + STORE_RETRY_SEC >= self.until:
                    raise LeaseLost(str(exc)) from exc
                log.warning("store call failed; retrying within the lease", extra={"error": str(exc)})
                await asyncio.sleep(STORE_RETRY_SEC)


class Workers:
    def __init__(self, config: BackendConfig, registry: Registry, store: TaskStore, files: ResultFiles,
                 results: ResultStore, disk: DiskSpace) -> None:
        self.config = config
        self.registry = registry
        self.store = store
        self.files = files
        self.results = results
        self.disk = disk
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
        async def step() -> None:  # the claim waits up to 1 s for work, so the loop needs no interval
            if self.disk.shortage() is not None:  # no room for another export's file: leave it to a backend with room
                await asyncio.sleep(1.0)
                return
            lease = await self.store.claim(consumer, self.config.lease_sec, wait_sec=1.0)
            if lease is None:
                return
            if self.disk.shortage() is not None:  # the disk filled while the claim waited: give the task back
                await self.store.update(lease.task_id, lifecycle.unclaimed(), enqueue=True, ack=lease)
                return
            await self._handle(lease, consumer)

        await periodic(f"worker {consumer}", step, 0.0, log, expected=store_down("new tasks wait"), retry_sec=1.0)

    async def _handle(self, lease: Lease, consumer: str) -> None:
        token = task_id_var.set(lease.task_id)
        trace_token = trace_id_var.set(None)
        try:
            begun = await self._begin(lease)
            if begun is not None:
                task, spec = begun
                traceparent = task.extra.get("traceparent", "")
                trace_id_var.set(traceparent.split("-")[1] if traceparent.count("-") == 3 else None)
                metrics.workers_busy.inc()
                try:
                    with tracing.export_run(task):
                        await self._run(task, spec, lease, consumer)
                finally:
                    metrics.workers_busy.dec()
        finally:
            task_id_var.reset(token)
            trace_id_var.reset(trace_token)

    async def _begin(self, lease: Lease) -> tuple[Task, ExportTypeConfig] | None:
        current = await self.store.get(lease.task_id)
        if current is None:
            await self.store.ack(lease)
            return None
        spec = await self._definition(current)
        if spec is None:
            await self.store.update(lease.task_id, lifecycle.finish(
                Status.FAILED, ttl_sec=self.config.task_ttl_sec, error=error_info(
                    "TYPE_DEFINITION_MISSING", f"the definition of export type {current.export_type} this task was "
                    "created under cannot be read any more; submit it again", retryable=False)), ack=lease)
            return None
        if current.status == Status.RUNNING:
            metrics.lease_reclaims.labels(current.export_type).inc()
        task, changed = await self.store.update(lease.task_id, lifecycle.begin(spec.max_attempts))
        if task is None or not changed or task.status != Status.RUNNING:
            await self.store.ack(lease)
            return None
        self.files.remove_partials(task.task_id)
        log.info("task started", extra={"attempt": task.attempt, "export_type": task.export_type})
        return task, spec

    async def _definition(self, task: Task) -> ExportTypeConfig | None:
        """The type as the task was created under it (its recorded definition), whatever the file says now."""
        try:
            return await self.registry.definition(task.export_type, task.type_digest)
        except ValueError as exc:  # the recorded definition no longer loads here (an ${ENV} it reads is unset)
            log.error("an export type's recorded definition does not load", extra={
                "export_type": task.export_type, "error": str(exc).splitlines()[0]})
            return None

    def _should_fail(self, task: Task, spec: ExportTypeConfig) -> bool:
        fault = spec.fault
        used = task.attempt - task.base_attempt + 1
        return used <= fault.fail_first_attempts or random.random() < fault.failure_rate

    async def _run(self, task: Task, spec: ExportTypeConfig, lease: Lease, consumer: str) -> None:
        job = ExportJob(
            spec, task, deadline=time.monotonic() + _deadline(task) - time.time(),
            part_path=self.files.partial(task.task_id, task.attempt),
            publish=self._publisher(task.result_key),
            fail_transiently=self._should_fail(task, spec),
            network=self.config.sources.policy(),
        )
        tracing.step(job.step)  # the first step, which a quick export may leave before its first progress report
        future = asyncio.get_running_loop().run_in_executor(self.executor, job.run)
        held = Held(lease)
        try:
            if await self._supervise(task, lease, consumer, job, future, held):
                await self._complete(task, spec, lease, job, future, held)
        except LeaseLost as exc:
            job.cancel()
            await asyncio.gather(future, return_exceptions=True)
            log.warning("lease lost while the store was unreachable; this attempt stopped and its output is "
                        "discarded (another worker runs the task)", extra={"attempt": task.attempt, "error": str(exc)})

    async def _supervise(self, task: Task, lease: Lease, consumer: str, job: ExportJob,
                         future: asyncio.Future[JobResult], held: Held) -> bool:
        """Watch the running export; True when it ended by itself, False when this attempt is over."""
        deadline = _deadline(task)
        while not future.done():
            remaining = deadline - time.time()
            if remaining <= 0:
                job.cancel()
                # the thread stops later with Cancelled, which nobody awaits: retrieve it, or asyncio
                # logs "Future exception was never retrieved" with a traceback for a normal TIMEOUT
                future.add_done_callback(lambda done: done.cancelled() or done.exception())
                await self._end(task, lease, held, self._timed_out(task, job))
                return False
            await asyncio.wait({future}, timeout=min(self.config.progress_interval_sec, remaining))
            if future.done():
                break
            try:
                current, _ = await self.store.update(task.task_id,
                                                     lifecycle.report(task.attempt, job.progress, job.step))
                await self.store.renew(lease, consumer)
            except (RedisError, SqlError, OSError) as exc:
                if time.monotonic() >= held.until:
                    raise LeaseLost(str(exc)) from exc
                log.warning("progress not written; the export goes on within its lease", extra={"error": str(exc)})
                continue
            held.renewed()
            tracing.step(job.step)
            if current is None or current.status != Status.RUNNING or current.attempt != task.attempt:
                job.cancel()
                await asyncio.gather(future, return_exceptions=True)
                log.info("task stopped at a safe point", extra={"status": current.status if current else None})
                await held.retrying(lambda: self.store.ack(lease))
                return False
        return True

    def _publisher(self, key: str) -> Callable[[Path], None]:
        """The job's store step, called from its thread: the upload runs on this event loop."""
        loop = asyncio.get_running_loop()

        def publish(path: Path) -> None:
            asyncio.run_coroutine_threadsafe(self.results.publish(path, key), loop).result()
        return publish

    async def _complete(self, task: Task, spec: ExportTypeConfig, lease: Lease, job: ExportJob,
                        future: asyncio.Future[JobResult], held: Held) -> None:
        ttl = self.config.task_ttl_sec
        try:
            result = future.result()
        except TransientFailure as exc:
            if task.attempt - task.base_attempt + 1 < spec.max_attempts:
                log.warning("transient failure; re-queued", extra={"attempt": task.attempt, "error": str(exc)})
                metrics.task_retries.labels(task.export_type).inc()
                await held.retrying(lambda: self.store.update(task.task_id, lifecycle.requeue(task.attempt),
                                                              enqueue=True, ack=lease))
                return
            change = lifecycle.finish(Status.FAILED, attempt=task.attempt, ttl_sec=ttl, error=error_info(
                "EXPORT_FAILED", f"failed {spec.max_attempts} times; last error: {exc}", retryable=False))
        except PermanentFailure as exc:
            change = lifecycle.finish(Status.FAILED, attempt=task.attempt, ttl_sec=ttl,
                                      error=error_info(exc.code, str(exc), retryable=False))
        except DeadlineReached:
            change = self._timed_out(task, job)
        except Cancelled:
            await held.retrying(lambda: self.store.ack(lease))
            return
        except OutOfSpace as exc:
            self.disk.write_failed()
            metrics.tasks_released.labels("disk_full").inc()
            log.warning("the disk filled up under the export; the task goes back to the queue for a backend with "
                        "room, without spending an attempt", extra={"attempt": task.attempt, "error": str(exc)})
            await held.retrying(lambda: self.store.update(task.task_id, lifecycle.release(task.attempt),
                                                          enqueue=True, ack=lease))
            return
        except Exception as exc:
            log.exception("export crashed")
            change = lifecycle.finish(Status.FAILED, attempt=task.attempt, ttl_sec=ttl, error=error_info(
                "EXPORT_ERROR", f"the export stopped on an unexpected error: {_described(exc)}", retryable=False))
        else:
            change = lifecycle.finish(Status.COMPLETED, attempt=task.attempt, ttl_sec=ttl, result={
                "download_url": f"/exports/{task.task_id}/file",
                "rows": result.rows, "bytes": result.bytes, "format": task.format, "compression": task.compression,
                **({"media_type": result.media_type} if result.media_type else {}),
            })
        await self._end(task, lease, held, change)

    def _timed_out(self, task: Task, job: ExportJob) -> Change:
        why = f"the export did not finish within {task.timeout_sec} s"
        if job.store_outage is not None:
            why += f": its file waited for the result store, which stayed unavailable ({job.store_outage})"
        return lifecycle.finish(Status.TIMEOUT, attempt=task.attempt, ttl_sec=self.config.task_ttl_sec,
                                error=error_info("TASK_TIMEOUT", why, retryable=True))

    async def _end(self, task: Task, lease: Lease, held: Held, change: Change) -> None:
        # a retried update is safe: `change` is conditional on this attempt still running
        final, changed = await held.retrying(lambda: self.store.update(task.task_id, change, ack=lease))
        if not changed:
            # someone else decided first (a cancel, or another worker took over): keep nothing of ours
            await held.retrying(lambda: self.store.ack(lease))
            if final is None or final.status != Status.COMPLETED:
                await self._discard(task.result_key)
        elif final is not None:
            metrics.task_ended(task.export_type, final.status, task.started_at, (final.result or {}).get("rows"))
            tracing.ended(final.status, (final.result or {}).get("rows"))
        log.info("task ended", extra={"status": final.status if final else None, "attempt": task.attempt})

    async def _discard(self, key: str) -> None:
        try:
            await self.results.delete(key)
        except StoreUnavailable as exc:
            log.warning("could not delete a result nobody will serve; the expiry sweep deletes it with the task",
                        extra={"key": key, "error": str(exc)})


def _described(exc: Exception) -> str:
    """The error's kind and, for an operating system error, its plain words (never a path or a traceback)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__} ({exc.strerror})"
    return type(exc).__name__


def _deadline(task: Task) -> float:
    """When the task times out (wall clock): `timeout_sec` after it started."""
    return (task.started_at or time.time()) + task.timeout_sec
