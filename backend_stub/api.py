"""The backend's HTTP API, as the gateway calls it (plain and exact; no public-edge concerns)."""
from __future__ import annotations

import hashlib
import logging
import math
import mimetypes
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from backend_stub import lifecycle, tracing
from backend_stub.byte_range import requested_range
from backend_stub.compression import MEDIA_TYPES
from backend_stub.config import BackendConfig
from backend_stub.files import ResultFiles
from backend_stub.formats import FORMATS, RAW
from backend_stub.http_fault import RequestCounter
from backend_stub.models import Task
from backend_stub.registry import Registry, etag_of
from backend_stub.result_store import (
    ObjectMissing,
    ResultStore,
    StoreUnavailable,
)
from backend_stub.store import TaskStore
from backend_stub.submission import parse_active_quota, parse_rerun, parse_submission
from backend_stub.type_view import estimated_sec
from exports_common.contract import DeliveryState, Status
from exports_common.envelope import ok, ok_body
from exports_common.errors import ApiError, ErrorKind, unavailable, validation_error
from exports_common.json_body import parse_json, read_limited
from exports_common.list_query import PARAMS, check_list_query
from exports_common.task_ids import is_task_id

STORE_RETRY_AFTER_SEC = 5
log = logging.getLogger("backend.api")


class BackendApi:
    def __init__(self, config: BackendConfig, registry: Registry, store: TaskStore, files: ResultFiles,
                 results: ResultStore, counter: RequestCounter) -> None:
        self.config = config
        self.registry = registry
        self.store = store
        self.files = files
        self.results = results
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
        """The registry in force, with an ETag; a request without a tenant (the gateway's own) also gets the
        callback allow-list."""
        body = ok_body(self.registry.current.answer(for_gateway="x-tenant-id" not in request.headers))
        etag = etag_of(body)
        headers = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "X-Tenant-Id"}
        if etag in (tag.strip() for tag in request.headers.get("if-none-match", "").split(",")):
            return Response(status_code=304, headers=headers)
        return Response(body, headers=headers, media_type="application/json")

    async def _json(self, request: Request) -> Any:
        body = await read_limited(request.stream(), self.config.max_body_bytes, request.headers.get("content-length"))
        return parse_json(body, request.headers.get("content-type"))

    def _estimate_sec(self, export_type: str) -> int | None:
        spec = self.registry.current.types.get(export_type)
        return estimated_sec(spec) if spec is not None else None

    async def create(self, request: Request) -> Response:
        task_id = request.headers.get("x-task-id", "")
        if not is_task_id(task_id):
            raise validation_error("X-Task-Id", "header must hold a task id matching the contract's pattern")
        tenant = request.headers.get("x-tenant-id", "")
        if not tenant or len(tenant) > 128:
            raise validation_error("X-Tenant-Id", "header must name the tenant (1 to 128 characters)")
        types = self.registry.current.types
        submission = parse_submission(await self._json(request), self.config, types)
        quota = parse_active_quota(request.headers.get("x-tenant-max-active-tasks"))
        await self._check_active_quota(tenant, task_id, quota)
        now = time.time()
        task = Task(
            task_id=task_id, tenant=tenant, export_type=submission.export_type, filters=submission.filters,
            format=submission.format, timeout_sec=submission.timeout_sec, callback_url=submission.callback_url,
            compression=types[submission.export_type].compression,
            type_digest=await self.registry.record(submission.export_type),
            fingerprint=submission.fingerprint(tenant), created_at=now, updated_at=now,
            callback=None if submission.callback_url is None else {"state": DeliveryState.PENDING, "attempts": 0,
                                                                   "last_error": None},
            extra=tracing.extra(request.headers.get("traceparent")),
        )
        stored, created = await self.store.create(task)
        if not created and stored.fingerprint != task.fingerprint:
            raise ApiError(ErrorKind.TASK_ID_CONFLICT, data={"task_id": task_id})
        data = stored.public(estimated_completion_sec=self._estimate_sec(stored.export_type))
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

    async def _owned(self, request: Request) -> Task:
        """The task, if it exists and belongs to the caller's tenant (when one is named)."""
        task_id = request.path_params["task_id"]
        task = await self.store.get(task_id) if is_task_id(task_id) else None
        tenant = request.headers.get("x-tenant-id")
        if task is None or (tenant is not None and task.tenant != tenant):
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        return task

    async def _visible(self, request: Request) -> Task:
        """The caller's task, if it has not expired."""
        task = await self._owned(request)
        if _expired(task):
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        return task

    async def get(self, request: Request) -> Response:
        return ok((await self._visible(request)).public())

    async def cancel(self, request: Request) -> Response:
        task = await self._visible(request)
        updated, changed = await self.store.update(task.task_id, lifecycle.cancel(self.config.task_ttl_sec))
        if updated is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        if not changed and updated.status != Status.CANCELLED:
            raise ApiError(ErrorKind.TASK_TERMINAL, f"the task is already {updated.status}", data=updated.public())
        return ok(updated.public())

    async def retry(self, request: Request) -> Response:
        task = await self._visible(request)
        spec = await self.registry.definition(task.export_type, task.type_digest)
        expected, overrides = parse_rerun(await self._json(request), self.config, task.export_type, spec)
        overrides["extra"] = dict(task.extra, **tracing.extra(request.headers.get("traceparent"), "rerun_traceparent"))
        updated, changed = await self.store.update(task.task_id, lifecycle.rerun(expected, overrides), enqueue=True)
        if updated is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND)
        if not changed:
            if updated.attempt != expected:
                raise ApiError(ErrorKind.STALE_ATTEMPT, f"the task is at attempt {updated.attempt}, not {expected}",
                               data=updated.public())
            raise ApiError(ErrorKind.NOT_RETRYABLE, f"a {updated.status} task cannot be re-run", data=updated.public())
        self.files.remove_partials(task.task_id)
        try:  # only TIMEOUT or FAILED tasks re-run, so there is rarely an object; the new attempt overwrites it
            await self.results.delete(task.result_key)
        except StoreUnavailable as exc:
            log.warning("could not delete the old result before a re-run", extra={"error": str(exc)})
        return ok(updated.public())

    async def list(self, request: Request) -> Response:
        query = check_list_query(request.query_params.multi_items(), PARAMS | {"tenant"})
        tenant = request.headers.get("x-tenant-id") or request.query_params.get("tenant")
        if not tenant or len(tenant) > 128:
            raise validation_error("tenant", "name the tenant (X-Tenant-Id header or tenant query parameter)")
        try:
            items, next_cursor = await self.store.list_tasks(tenant, query.status, query.limit, query.cursor)
        except ValueError as exc:
            raise validation_error("cursor", str(exc)) from exc
        now = time.time()
        visible = [t.public() for t in items if not (t.terminal and t.expire_at and t.expire_at <= now)]
        return ok({"items": visible, "next_cursor": next_cursor})

    async def file(self, request: Request) -> Response:
        task = await self._owned(request)
        if _expired(task):
            raise ApiError(ErrorKind.FILE_GONE)
        if task.status != Status.COMPLETED or task.result is None:
            raise ApiError(ErrorKind.TASK_NOT_FOUND, "the task has no result file (not COMPLETED)")
        key = task.result_key
        if request.method == "GET" and self.config.download_redirect.ttl_sec:
            location = await self._presigned(task, key)
            if location is not None:  # the URL is a credential: no cache may keep it
                return Response(status_code=307, headers={"Location": location, "Cache-Control": "no-store"})
        size = int(task.result["bytes"])
        etag = _etag(task.task_id, task.attempt, key, size)
        # nosniff: a raw answer keeps its endpoint's media type (text/html, say), which no browser may second-guess
        headers = {"Accept-Ranges": "bytes", "Content-Disposition": f'attachment; filename="{_file_name(task)}"',
                   "X-Content-Type-Options": "nosniff", "ETag": etag}
        media = _media_type(task)
        # a resume names the file it began (If-Range): another file, or a date (no Last-Modified is sent), gets it
        # whole (RFC 9110 13.1.5), so a client never appends one file's end to another's start
        if_range = request.headers.get("if-range")
        span = requested_range(request.headers.get("range"), size) if if_range in (None, etag) else None
        first, last = span or (0, size - 1)
        headers["Content-Length"] = str(last - first + 1)
        if span is not None:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        if request.method == "HEAD":
            return Response(status_code=206 if span else 200, headers=headers, media_type=media)
        try:
            chunks = await self.results.read(key, first, last) if size else _nothing()
        except ObjectMissing:
            # the store answered, and the object is gone for good (lost with a store's data, or deleted behind
            # our back, or backends on different stores): a 410, which no breaker or retry takes for an outage
            log.error("result object missing for a live task: the result store lost it, or the backends do not "
                      "share one result_store", extra={"key": key, "store": self.results.name})
            raise ApiError(ErrorKind.RESULT_LOST, data={"task_id": task.task_id}) from None
        except StoreUnavailable as exc:
            log.warning("result store unavailable", extra={"key": key, "error": str(exc)})
            raise unavailable("the result store cannot be reached", STORE_RETRY_AFTER_SEC) from None
        return StreamingResponse(chunks, status_code=206 if span else 200, headers=headers, media_type=media)

    async def _presigned(self, task: Task, key: str) -> str | None:
        """A store URL for the file, valid `download_redirect.ttl_sec` but never past the task's expiry."""
        ttl = self.config.download_redirect.ttl_sec
        if task.expire_at is not None:
            ttl = min(ttl, max(1, math.ceil(task.expire_at - time.time())))
        try:
            return await self.results.presigned_get(key, ttl)
        except StoreUnavailable as exc:
            log.warning("could not sign a store URL", extra={"key": key, "error": str(exc)})
            raise unavailable("the result store cannot be reached", STORE_RETRY_AFTER_SEC) from None


def _media_type(task: Task) -> str:
    if task.compression:
        return MEDIA_TYPES[task.compression]
    if task.format == RAW:
        return str((task.result or {}).get("media_type") or "application/octet-stream")
    written = FORMATS.get(task.format)
    return written.media_type if written is not None else "application/octet-stream"


def _file_name(task: Task) -> str:
    """What a download is saved as: the stored name, or for a raw result the task id with the extension its
    media type implies (none when it implies none)."""
    if task.format != RAW or task.compression:
        return task.result_key
    return task.task_id + (mimetypes.guess_extension(_media_type(task).split(";", 1)[0].strip()) or "")


def _expired(task: Task) -> bool:
    return task.expire_at is not None and task.terminal and task.expire_at <= time.time()


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""


def _etag(task_id: str, attempt: int, key: str, size: int) -> str:
    """A strong validator of a task's result file: another attempt's file, or another object, has another."""
    return '"' + hashlib.sha256(f"{task_id}:{attempt}:{key}:{size}".encode()).hexdigest()[:32] + '"'
