"""The blocking client: `ExportsClient`. `AsyncExportsClient` (exports_client.aio) has the same methods."""
from __future__ import annotations

import builtins
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Self

import httpx

from exports_client import core, polling
from exports_client.errors import WaitTimeout
from exports_client.models import ExportType, Task
from exports_client.webhooks import verify_webhook

ProgressCallback = Callable[[Task], None]
Dest = str | os.PathLike[str] | BinaryIO


class ExportsClient:
    """Submit, poll, cancel and download exports through the gateway.

    `clock`, `sleep` and `rng` are injectable so the timing policy can run on a
    simulated clock; `transport` takes any httpx transport (a test double, a proxy).
    """

    verify_webhook = staticmethod(verify_webhook)

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 10.0,
                 retries: int = 3, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.base_url, self._api_key = core.resolve(base_url, api_key)
        self._rng = rng or random.Random()
        self._policy = core.RetryPolicy(retries=retries, rng=self._rng)
        self._clock = clock
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers={"User-Agent": core.USER_AGENT})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one request, retried within bounds ------------------------------------------------------

    def _once(self, call: core.Call) -> httpx.Response:
        return self._http.request(call.method, call.path, params=call.params, json=call.json,
                                  headers={**core.auth_headers(self._api_key), **call.headers})

    def _send(self, call: core.Call) -> httpx.Response:
        attempt, waited = 1, 0.0
        while True:
            try:
                resp = self._once(call)
            except core.TRANSPORT_ERRORS as exc:
                delay = self._policy.delay(attempt, None, waited)
                if delay is None:
                    raise core.unreachable(self.base_url, exc) from exc
            else:
                if not core.is_retryable(resp, call):
                    return resp
                delay = self._policy.delay(attempt, core.retry_after_of(resp), waited)
                if delay is None:
                    raise core.error_of(resp)
            self._sleep(delay)
            attempt, waited = attempt + 1, waited + delay

    def _data(self, call: core.Call) -> Any:
        return core.data_of(self._send(call))

    # -- the API ---------------------------------------------------------------------------------

    def submit(self, export_type: str, filters: Mapping[str, Any] | None = None, *, format: str | None = None,
               timeout_sec: int | None = None, callback_url: str | None = None,
               idempotency_key: str | None = None) -> Task:
        call = core.submit_call(export_type, filters, format, timeout_sec, callback_url, idempotency_key)
        return Task.from_dict(self._data(call))

    def get(self, task_id: str) -> Task:
        return Task.from_dict(self._data(core.Call("GET", core.task_path(task_id))))

    def cancel(self, task_id: str) -> Task:
        return Task.from_dict(self._data(core.Call("POST", core.task_path(task_id, "/cancel"))))

    def list(self, status: str | None = None, *, page_size: int = 100) -> Iterator[Task]:
        cursor: str | None = None
        while True:
            params = {"limit": str(page_size), **({"status": status} if status else {}),
                      **({"cursor": cursor} if cursor else {})}
            page = self._data(core.Call("GET", "/api/v1/exports", params=params))
            yield from (Task.from_dict(item) for item in page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def export_types(self) -> builtins.list[ExportType]:  # `list` here would be the method
        page = self._data(core.Call("GET", "/api/v1/export-types"))
        return [ExportType.from_dict(item) for item in page["items"]]

    def wait(self, task_id_or_token: str, *, max_wait: float = 300, on_progress: ProgressCallback | None = None) -> Task:
        """Poll until the task is terminal; after `max_wait` s raise WaitTimeout (its token resumes here)."""
        started = self._clock()
        plan = polling.plan_for(task_id_or_token, started, max_wait, self._rng)
        call = core.Call("GET", core.task_path(plan.task_id))
        while True:
            pause = plan.sleep_before_poll(self._clock())
            if pause is None:
                self._sleep(max(0.0, plan.deadline - self._clock()))
                raise WaitTimeout(plan.last, plan.token(), self._clock() - started)
            self._sleep(pause)
            try:
                resp = self._once(call)
            except core.TRANSPORT_ERRORS as exc:
                plan.transport_failures += 1
                if plan.transport_failures > self._policy.retries:
                    raise core.unreachable(self.base_url, exc) from exc
                plan.refused(self._clock(), None)
                continue
            if core.is_retryable(resp, call):
                plan.refused(self._clock(), core.retry_after_of(resp))
                continue
            task = Task.from_dict(core.data_of(resp))
            if task.terminal:
                return task
            plan.answered(self._clock(), task, core.retry_after_of(resp))
            if on_progress is not None:
                on_progress(task)

    def download(self, task_id_or_task: str | Task, dest: Dest, *, resume: bool = True,
                 attempts: int = 5) -> Path | None:
        """Stream the result to `dest`; an interrupted transfer goes on with Range. Returns the path written."""
        task = self.get(task_id_or_task) if isinstance(task_id_or_task, str) else task_id_or_task
        url, expected = core.link(self.base_url, task)
        sink = core.Sink(dest, resume)
        try:
            for attempt in range(1, attempts + 1):
                if sink.written >= expected:
                    break
                auth = core.auth_headers(self._api_key) if core.same_origin(url, self.base_url) else {}
                try:
                    with self._http.stream("GET", url, headers={**auth, **sink.headers()}) as resp:
                        if resp.status_code in core.LINK_REFUSED and attempt < attempts:
                            url, expected = core.link(self.base_url, self.get(task.task_id))
                            continue
                        sink.accept(resp)
                        for chunk in resp.iter_bytes():
                            sink.write(chunk)
                except core.TRANSPORT_ERRORS as exc:
                    if attempt == attempts:
                        raise core.unreachable(url, exc) from exc
                    self._sleep(polling.full_jitter(attempt - 1, self._rng, floor=0.2, ceiling=8.0))
            return sink.finish(expected)
        finally:
            sink.close()
