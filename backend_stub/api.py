"""The backend's HTTP API, as the gateway calls it (plain and exact; no public-edge concerns)."""
from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from backend_stub import lifecycle
from backend_stub.config import BackendConfig
from backend_stub.files import ResultFiles
from backend_stub.filters import filters_schema
from backend_stub.http_fault import RequestCounter
from backend_stub.models import COMPLETED, STATUSES, Task
from backend_stub.store import TaskStore
from backend_stub.submission import parse_active_quota, parse_rerun, parse_submission
from exports_common.envelope import ok
from exports_common.errors import ApiError, ErrorKind, validation_error
from exports_common.json_body import parse_json, read_limited
from exports_common.submit_body import FORMATS
from exports_common.task_ids import is_task_id

MAX_LIST_LIMIT = 500


class BackendApi:
    def __init__(self, config: BackendConfig, store: TaskStore, files: ResultFiles, counter: RequestCounter) -> None:
        self.config = config
        self.store = store
        self.files = files
        self.counter = counter

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/export-types", self.export_types, methods=["GET"]),
            Route("/exports", self.create, methods=["POST"]),
            Route("/exports", self.list, methods=["GET"]),
            Route("/exports/{task_id}", self.get, methods=["GET"]),
            Route("/exports/{task_id}/cancel", self.cancel, methods=["POST"]),
            Route("/exports/{task_id}/retry", self.retry, methods=["POST"]),
            Route("/exports/{task_id}/file", self.file, methods=["GET", "HEAD"]),
        ]

    async def healthz(self, request: Request) -> Response:
        return ok({"status": "ok", "store": "redis" if self.config.redis_url else "sqlite",
                   "requests": self.counter.requests})

    async def export_types(self, request: Request) -> Response:
        items = [{"export_type": name, "filters_schema": filters_schema(spec.filters), "formats": list(FORMATS),
                  "max_attempts": spec.max_attempts, "estimated_completion_sec": self._estimate_sec(name)}
                 for name, spec in self.config.export_types.items()]
        return ok({"items": items})

    async def _json(self, request: Request) -> Any:
        body = await read_limited(request.stream(), self.config.max_body_bytes, request.headers.get("content-length"))
        return parse_json(body, request.headers.get("content-type"))

    def _estimate_sec(self, export_type: str) -> int:
        spec = self.config.export_types[export_type]
        return max(1, round(spec.rows / spec.estimated_rows_per_sec + spec.fault.delay_sec))

    async def create(self, request: Request) -> Response:
        task_id = request.headers.get("x-task-id", "")
        if not is_task_id(task_id):
            raise validation_error("X-Task-Id", "header must hold a task id matching the contract's pattern")
        tenant = request.headers.get("x-tenant-id", "")
        if not tenant or len(tenant) > 128:
            raise validation_error("X-Tenant-Id", "header must name the tenant (1 to 128 characters)")
        submission = parse_submission(await self._json(request), self.config)
        quota = parse_active_quota(request.headers.get("x-tenant-max-active-tasks"))
        await self._check_active_quota(tenant, task_id, quota)
        now = time.time()
        task = Task(
            task_id=task_id, tenant=tenant, export_type=submission.export_type, filters=submission.filters,
            format=submission.format, timeout_sec=submission.timeout_sec, callback_url=submission.callback_url,
            fingerprint=submission.fingerprint(tenant), created_at=now, updated_at=now,
            callback={"state": "PENDING", "attempts": 0, "last_error": None} if submission.callback_url else None,
            extra={"traceparent": request.headers["traceparent"]} if "traceparent" in request.headers else {},
        )
        stored, created = await self.store.create(task)
        if not created and stored.fingerprint != task.fingerprint:
            raise ApiError(ErrorKind.TASK_ID_CONFLICT, data={"task_id": task_id})
        data = dict(stored.public(), estimated_completion_sec=self._estimate_sec(stored.export_type))
        return ok(data, status=201 if created else 200, headers={"Location": f"/exports/{task_id}"})

    async def _check_active_quota(self, tenant: str, task_id: str, quota: int | None) -> None:
        # a repeated create of an existing task answers with that task, quota or not
        if quota is None or await self.store.get(task_id) is not None:
            return
        active = await self.store.active_count(tenant)
        if active >= quota:
            raise ApiError(ErrorKind.TOO_MANY_ACTIVE_TASKS,
                           f"tenant {tenant} has {active} active tasks (PENDING or RUNNING) and may have {quota}; "
                           f"wait for some to finish or cancel some, then submit again",
                           data={"active": active, "limit": quota})

    async def _visible(self, request: Request) -> Task:
        """The task, if it exists, has not expired, and belongs to the caller's tenant (when one is named)."""
        task_id = request.path_params["task_id"]
        task = await self.store.get(task_id) if is_task_id(task_id) else None
        tenant = request.headers.get("x-tenant-id")
        if (
            task is None
            or (tenant is not None and task.tenant != tenant)
            or (task.expire_at is not None and task.terminal and task.expire_at <= time.time())
        ):
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        return task

    async def get(self, request: Request) -> Response:
        return ok((await self._visible(request)).public())

    async def cancel(self, request: Request) -> Response:
        task = await self._visible(request)
        updated, changed = await self.store.update(task.task_id, lifecycle.cancel(self.config.task_ttl_sec))
        if updated is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        if not changed and updated.status != "CANCELLED":
            raise ApiError(ErrorKind.TASK_TERMINAL, f"the task is already {updated.status}", data=updated.public())
        return ok(updated.public())

    async def retry(self, request: Request) -> Response:
        task = await self._visible(request)
        expected, overrides = parse_rerun(await self._json(request), self.config)
        updated, changed = await self.store.update(task.task_id, lifecycle.rerun(expected, overrides), enqueue=True)
        if updated is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        if not changed:
            if updated.attempt != expected:
                raise ApiError(ErrorKind.STALE_ATTEMPT, f"the task is at attempt {updated.attempt}, not {expected}",
                               data=updated.public())
            raise ApiError(ErrorKind.NOT_RETRYABLE, f"a {updated.status} task cannot be re-run", data=updated.public())
        self.files.remove_all(task.task_id)
        return ok(updated.public())

    async def list(self, request: Request) -> Response:
        params = request.query_params
        tenant = request.headers.get("x-tenant-id") or params.get("tenant")
        if not tenant:
            raise validation_error("tenant", "name the tenant (X-Tenant-Id header or tenant query parameter)")
        status = params.get("status")
        if status is not None and status not in STATUSES:
            raise validation_error("status", f"must be one of {list(STATUSES)}")
        raw_limit = params.get("limit", "50")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise validation_error("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}")
        try:
            cursor = params.get("cursor") or None
            items, next_cursor = await self.store.list_tasks(tenant, status, int(raw_limit), cursor)
        except ValueError as exc:
            raise validation_error("cursor", str(exc)) from exc
        now = time.time()
        visible = [t.public() for t in items if not (t.terminal and t.expire_at and t.expire_at <= now)]
        return ok({"items": visible, "next_cursor": next_cursor})

    async def file(self, request: Request) -> Response:
        task = await self._visible(request)
        path = self.files.final(task.task_id, task.format)
        if task.status != COMPLETED or not path.exists():
            raise ApiError(ErrorKind.FILE_GONE if task.status == COMPLETED else ErrorKind.TASK_NOT_FOUND,
                           None if task.status == COMPLETED else "the task has no result file (not COMPLETED)")
        media = "text/csv; charset=utf-8" if task.format == "csv" else "application/x-ndjson"
        return FileResponse(path, media_type=media, filename=path.name)
