"""Operator recovery, as the gateway's admin API calls it: dead letters, failed tasks, re-delivery, re-run.

These `/internal/` endpoints are for the gateway alone (which checks the admin
token, logs the audit line and is the only caller that can reach them); the
gateway's public routes never forward to them.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backend_stub import lifecycle, metrics, tracing
from backend_stub.models import Task
from backend_stub.store import Change, TaskStore
from exports_common.contract import TERMINAL, Status
from exports_common.envelope import ok
from exports_common.errors import ApiError, ErrorKind, validation_error
from exports_common.json_body import parse_json, read_limited
from exports_common.task_ids import is_task_id

log = logging.getLogger("backend.admin")
MAX_LIMIT = 200
MAX_BATCH = 100
SCAN_PAGES = 20  # a dead-letter page reads at most this many pages of the tenant's tasks


def _redeliver(task: Task) -> Task | None:
    if task.status not in TERMINAL or not task.callback_url:
        return None
    return lifecycle.notify(task, time.time())


def _rerun(task: Task, link: dict[str, str]) -> Task | None:
    """An operator's re-run: any FAILED or TIMEOUT task, retryable or not, starts again as the next attempt.

    The new attempt's run links to the operator's request (`link`), not to what asked for an earlier re-run.
    """
    if task.status not in (Status.FAILED, Status.TIMEOUT):
        return None
    attempt = task.attempt + 1
    extra = {k: v for k, v in task.extra.items() if k != "rerun_traceparent"} | link
    return dataclasses.replace(task, status=Status.PENDING, attempt=attempt, base_attempt=attempt, progress=0,
                               current_step=None, started_at=None, finished_at=None, expire_at=None, result=None,
                               error=None, updated_at=time.time(), extra=extra)


class AdminApi:
    def __init__(self, store: TaskStore) -> None:
        self.store = store

    def routes(self) -> list[Route]:
        return [
            Route("/internal/tasks", self.tasks, methods=["GET"]),
            Route("/internal/callbacks/failed", self.dead_letters, methods=["GET"]),
            Route("/internal/callbacks/redeliver", self.redeliver_batch, methods=["POST"]),
            Route("/internal/tasks/{task_id}/redeliver", self.redeliver, methods=["POST"]),
            Route("/internal/tasks/{task_id}/rerun", self.rerun, methods=["POST"]),
        ]

    @staticmethod
    def _page(request: Request) -> tuple[str, int, str | None]:
        params = request.query_params
        tenant = params.get("tenant", "")
        if not tenant or len(tenant) > 128:
            raise validation_error("tenant", "name the tenant (1 to 128 characters)")
        raw = params.get("limit", "50")
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:  # isdigit alone takes '²'
            raise validation_error("limit", f"must be an integer from 1 to {MAX_LIMIT}")
        return tenant, int(raw), params.get("cursor") or None

    async def _list(self, tenant: str, status: str | None, limit: int, cursor: str | None
                    ) -> tuple[list[Task], str | None]:
        try:
            return await self.store.list_tasks(tenant, status, limit, cursor)
        except ValueError as exc:
            raise validation_error("cursor", str(exc)) from exc

    async def tasks(self, request: Request) -> Response:
        tenant, limit, cursor = self._page(request)
        status = request.query_params.get("status", Status.FAILED)
        if status not in (Status.FAILED, Status.TIMEOUT):
            raise validation_error("status", "must be FAILED or TIMEOUT")
        items, next_cursor = await self._list(tenant, status, limit, cursor)
        return ok({"items": [_view(t) for t in items], "next_cursor": next_cursor})

    async def dead_letters(self, request: Request) -> Response:
        """Tasks whose last notification was given up on, newest first; a page scans a bounded part of the tenant."""
        tenant, limit, cursor = self._page(request)
        found: list[Task] = []
        for _ in range(SCAN_PAGES):
            items, cursor = await self._list(tenant, None, limit, cursor)
            found += [t for t in items if t.callback and t.callback.get("state") == "FAILED"]
            if cursor is None or len(found) >= limit:
                break
        return ok({"items": [_view(t) for t in found[:limit]], "next_cursor": cursor})

    async def _change(self, task_id: str, change: Change, action: str, **kwargs: Any) -> Task:
        if not is_task_id(task_id):
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        updated, changed = await self.store.update(task_id, change, **kwargs)
        if updated is None:
            metrics.operator_actions.labels(action, "not_found").inc()
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        if not changed:
            metrics.operator_actions.labels(action, "refused").inc()
            raise ApiError(ErrorKind.NOT_RETRYABLE, f"{action}: not possible for a {updated.status} task"
                           + ("" if updated.callback_url or action == "rerun" else " without a callback_url"),
                           data=_view(updated))
        metrics.operator_actions.labels(action, "done").inc()
        log.info(f"operator {action}", extra={"task_id": task_id, "callback_seq": updated.callback_seq,
                                               "attempt": updated.attempt})
        return updated

    async def redeliver(self, request: Request) -> Response:
        return ok(_view(await self._change(request.path_params["task_id"], _redeliver, "redeliver")))

    async def rerun(self, request: Request) -> Response:
        link = tracing.extra(request.headers.get("traceparent"), "rerun_traceparent")
        return ok(_view(await self._change(request.path_params["task_id"], functools.partial(_rerun, link=link),
                                           "rerun", enqueue=True)))

    async def redeliver_batch(self, request: Request) -> Response:
        body = parse_json(await read_limited(request.stream(), 65_536, request.headers.get("content-length")),
                          request.headers.get("content-type"))
        ids = body.get("task_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_BATCH or not all(isinstance(i, str) for i in ids):
            raise validation_error("task_ids", f"must be a list of 1 to {MAX_BATCH} task ids")
        results: dict[str, Any] = {}
        for task_id in dict.fromkeys(ids):
            try:
                results[task_id] = {"ok": True, "callback_seq": (await self._change(task_id, _redeliver,
                                                                                   "redeliver")).callback_seq}
            except ApiError as exc:
                results[task_id] = {"ok": False, "code": exc.kind.code, "message": exc.message}
        return ok({"results": results})


def _view(task: Task) -> dict[str, Any]:
    return dict(task.public(), tenant=task.tenant, callback_seq=task.callback_seq)
