"""The backend's Prometheus metrics: what its workers, callbacks and janitor do, served at GET /metrics.

Counters and histograms are prometheus_client instruments in a registry of the
backend's own, created at import and given their known label values at start-up
(`seed`), so every series reads 0 before its first event instead of being absent.
The task counts per tenant and status and the change log's size are read from the store
at scrape time: they are shared by every backend process on one store, so any one scrape sees all.
"""
from __future__ import annotations

import time
from typing import Awaitable, Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from backend_stub.store import TaskStore
from exports_common.contract import TERMINAL

REGISTRY = CollectorRegistry(auto_describe=True)
SECONDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
ROWS = (10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
CALLBACK_OUTCOMES = ("delivered", "retry", "failed")

tasks = Gauge("backend_tasks", "tasks in the store, by tenant and status", ("tenant", "status"), registry=REGISTRY)
oldest_pending_age = Gauge("backend_queue_oldest_pending_age_seconds",
                           "age of the oldest PENDING task, by tenant (0 when none waits)", ("tenant",),
                           registry=REGISTRY)
task_duration = Histogram("backend_task_duration_seconds", "one attempt's run, from start to its end status",
                          ("export_type", "status"), buckets=SECONDS, registry=REGISTRY)
task_rows = Histogram("backend_task_rows", "rows written by a completed export", ("export_type",), buckets=ROWS,
                      registry=REGISTRY)
workers = Gauge("backend_workers", "worker loops in this process", registry=REGISTRY)
workers_busy = Gauge("backend_workers_busy", "worker loops running an export now", registry=REGISTRY)
lease_reclaims = Counter("backend_lease_reclaims", "tasks taken over from a worker that stopped holding them",
                         ("export_type",), registry=REGISTRY)
task_retries = Counter("backend_task_retries", "attempts re-queued after a transient failure", ("export_type",),
                       registry=REGISTRY)
result_store_retries = Counter("backend_result_store_retries", "uploads to the result store tried again after it "
                               "failed (an outage waited out within the task's timeout)", registry=REGISTRY)
tasks_released = Counter("backend_tasks_released", "attempts given back to the queue without spending an attempt, "
                         "by reason (disk_full: the spool's disk filled up)", ("reason",), registry=REGISTRY)
disk_free = Gauge("backend_disk_free_bytes", "free space under data_dir, where exports spool", registry=REGISTRY)
disk_short = Gauge("backend_disk_short", "1 while this backend claims no task for want of disk space (below "
                   "min_free_bytes, or an export ran out of space and not enough has come free since)",
                   registry=REGISTRY)
task_ends = Counter("backend_task_ends", "attempts that ended, by status", ("export_type", "status"),
                    registry=REGISTRY)
config_reloads = Counter("backend_config_reloads", "config reloads: applied, refused (invalid or unsafe) or "
                         "refused_removals (it removed export types)", ("outcome",), registry=REGISTRY)
callbacks = Counter("backend_callback_deliveries", "callback delivery tries, by outcome", ("outcome",),
                    registry=REGISTRY)
callback_claims_taken_over = Counter(
    "backend_callback_claims_taken_over", "callback deliveries claimed after the last claim ran out without an "
    "outcome (a backend died mid-delivery): each may reach the receiver twice", registry=REGISTRY)
callback_delay = Histogram("backend_callback_delivery_delay_seconds",
                           "from the task's end to its callback's delivery", buckets=SECONDS, registry=REGISTRY)
change_log_entries = Gauge("backend_change_log_entries", "entries kept in the store's change log",
                           registry=REGISTRY)
change_log_oldest_age = Gauge("backend_change_log_oldest_age_seconds",
                              "age of the oldest entry of the change log (0 when empty)", registry=REGISTRY)
janitor_deletions = Counter("backend_janitor_deletions", "expired tasks deleted with their files", registry=REGISTRY)
operator_actions = Counter("backend_operator_actions", "operator recovery actions, by action and outcome",
                           ("action", "outcome"), registry=REGISTRY)


def seed(export_types: Iterable[str], worker_count: int) -> None:
    """Every known label combination at zero, so a rate() or an alert has a series from the first scrape."""
    workers.set(worker_count)
    for export_type in export_types:
        lease_reclaims.labels(export_type)
        task_retries.labels(export_type)
        task_rows.labels(export_type)
        for status in sorted(TERMINAL):
            task_ends.labels(export_type, status)
            task_duration.labels(export_type, status)
    for outcome in CALLBACK_OUTCOMES:
        callbacks.labels(outcome)
    tasks_released.labels("disk_full")
    for outcome in ("applied", "refused", "refused_removals"):
        config_reloads.labels(outcome)


def task_ended(export_type: str, status: str, started_at: float | None, rows: int | None) -> None:
    task_ends.labels(export_type, status).inc()
    if started_at is not None:
        task_duration.labels(export_type, status).observe(max(0.0, time.time() - started_at))
    if rows is not None:
        task_rows.labels(export_type).observe(rows)


def callback_outcome(error: str | None, last_try: bool) -> str:
    return "delivered" if error is None else ("failed" if last_try else "retry")


def callback_tried(outcome: str, finished_at: float | None) -> None:
    callbacks.labels(outcome).inc()
    if outcome == "delivered" and finished_at is not None:
        callback_delay.observe(max(0.0, time.time() - finished_at))


def set_task_counts(counts: dict[tuple[str, str], int], oldest_pending: dict[str, float]) -> None:
    """Replace the store-derived gauges: a tenant whose tasks are gone drops out instead of going stale."""
    now = time.time()
    tasks.clear()
    for (tenant, status), n in counts.items():
        tasks.labels(tenant, status).set(n)
    oldest_pending_age.clear()
    for tenant in {tenant for tenant, _ in counts}:
        created = oldest_pending.get(tenant)
        oldest_pending_age.labels(tenant).set(max(0.0, now - created) if created is not None else 0.0)


def set_change_log(entries: int, oldest_age_sec: float | None) -> None:
    change_log_entries.set(entries)
    change_log_oldest_age.set(oldest_age_sec or 0.0)


def endpoint(store: TaskStore) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        set_task_counts(*await store.task_counts())
        set_change_log(*await store.change_log_stats())
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return serve
