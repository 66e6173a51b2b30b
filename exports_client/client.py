"""The blocking client: `ExportsClient`. `AsyncExportsClient` (exports_client.aio) has the same methods."""
from __future__ import annotations

import builtins
import random
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from exports_client import core, flows
from exports_client.models import ExportType, Task
from exports_client.webhooks import verify_webhook

T = TypeVar("T")
ProgressCallback = Callable[[Task], None]


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
        self.base_url, api_key = core.resolve(base_url, api_key)
        rng = rng or random.Random()
        self._ctx = flows.Context(self.base_url, api_key, core.RetryPolicy(retries=retries, rng=rng), rng, clock)
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers={"User-Agent": core.USER_AGENT})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, flow: flows.Flow[T]) -> T:
        """Carry out a flow's steps with blocking calls; an error goes back into the flow."""
        reply: httpx.Response | None = None
        failure: Exception | None = None
        while True:
            try:
                step = flow.throw(failure) if failure is not None else flow.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply, failure = None, None
            try:
                if isinstance(step, flows.Sleep):
                    self._sleep(step.seconds)
                elif isinstance(step, flows.Stream):
                    reply = self._stream(step)
                else:
                    reply = self._http.request(step.method, step.path, params=step.params, json=step.json,
                                               headers={**core.auth_headers(self._ctx.api_key), **step.headers})
            except Exception as exc:  # noqa: BLE001 (back into the flow: it retries transport errors and re-raises the rest after its cleanup)
                failure = exc

    def _stream(self, step: flows.Stream) -> httpx.Response:
        with self._http.stream("GET", step.url, headers=step.headers) as resp:
            if core.not_streamed(resp):
                resp.read()
                return resp
            step.sink.accept(resp)
            for chunk in resp.iter_bytes():
                step.sink.write(chunk)
        return resp

    def submit(self, export_type: str, filters: Mapping[str, Any] | None = None, *, format: str | None = None,
               timeout_sec: int | None = None, callback_url: str | None = None,
               idempotency_key: str | None = None) -> Task:
        """Submit an export; always with an Idempotency-Key (generated unless given), the same on every retry."""
        return self._run(flows.submit(self._ctx, export_type, filters, format, timeout_sec, callback_url,
                                      idempotency_key))

    def get(self, task_id: str) -> Task:
        return self._run(flows.get(self._ctx, task_id))

    def cancel(self, task_id: str) -> Task:
        return self._run(flows.task(self._ctx, core.Call("POST", core.task_path(task_id, "/cancel"))))

    def list(self, status: str | None = None, *, page_size: int = 100) -> Iterator[Task]:
        """Every task of the caller, newest first, page after page."""
        cursor: str | None = None
        while True:
            page = self._run(flows.list_page(self._ctx, status, page_size, cursor))
            yield from (Task.from_dict(item) for item in page["items"])
            if not (cursor := page.get("next_cursor")):
                return

    def export_types(self) -> builtins.list[ExportType]:  # `list` here would be the method
        return self._run(flows.export_types(self._ctx))

    def wait(self, task_id_or_token: str, *, max_wait: float = 300,
             on_progress: ProgressCallback | None = None) -> Task:
        """Poll until the task is terminal; after `max_wait` s raise WaitTimeout (its token resumes here)."""
        return self._run(flows.wait(self._ctx, task_id_or_token, max_wait, on_progress))

    def download(self, task_id_or_task: str | Task, dest: core.Dest, *, resume: bool = True,
                 attempts: int = 5) -> Path | None:
        """Stream the result to `dest`; an interrupted transfer goes on with Range. Returns the path written."""
        return self._run(flows.download(self._ctx, task_id_or_task, dest, resume, attempts))
