"""The asyncio client: `AsyncExportsClient`, the same methods as `ExportsClient`, awaited."""
from __future__ import annotations

import asyncio
import builtins
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from exports_client import core, flows
from exports_client.client import ProgressCallback
from exports_client.models import ExportType, Task
from exports_client.webhooks import verify_webhook

T = TypeVar("T")


class AsyncExportsClient:
    """`ExportsClient` for asyncio: the same flows, driven with awaits."""

    verify_webhook = staticmethod(verify_webhook)

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 10.0,
                 retries: int = 3, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        self.base_url, api_key = core.resolve(base_url, api_key)
        rng = rng or random.Random()
        self._ctx = flows.Context(self.base_url, api_key, core.RetryPolicy(retries=retries, rng=rng), rng, clock)
        self._sleep = sleep
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport,
                                       headers={"User-Agent": core.USER_AGENT})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, flow: flows.Flow[T]) -> T:
        """Carry out a flow's steps with awaits; an error goes back into the flow."""
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
                    await self._sleep(step.seconds)
                elif isinstance(step, flows.Stream):
                    reply = await self._stream(step)
                else:
                    reply = await self._http.request(step.method, step.path, params=step.params, json=step.json,
                                                     headers={**core.auth_headers(self._ctx.api_key), **step.headers})
            except Exception as exc:  # noqa: BLE001 (back into the flow: it retries transport errors and re-raises the rest after its cleanup)
                failure = exc

    async def _stream(self, step: flows.Stream) -> httpx.Response:
        async with self._http.stream("GET", step.url, headers=step.headers) as resp:
            if core.not_streamed(resp):
                await resp.aread()
                return resp
            step.sink.accept(resp)
            async for chunk in resp.aiter_bytes():
                step.sink.write(chunk)
        return resp

    async def submit(self, export_type: str, filters: Mapping[str, Any] | None = None, *,
                     format: str | None = None, timeout_sec: int | None = None, callback_url: str | None = None,
                     idempotency_key: str | None = None) -> Task:
        return await self._run(flows.submit(self._ctx, export_type, filters, format, timeout_sec, callback_url,
                                            idempotency_key))

    async def get(self, task_id: str) -> Task:
        return await self._run(flows.get(self._ctx, task_id))

    async def cancel(self, task_id: str) -> Task:
        return await self._run(flows.task(self._ctx, core.Call("POST", core.task_path(task_id, "/cancel"))))

    async def list(self, status: str | None = None, *, page_size: int = 100) -> AsyncIterator[Task]:
        cursor: str | None = None
        while True:
            page = await self._run(flows.list_page(self._ctx, status, page_size, cursor))
            for item in page["items"]:
                yield Task.from_dict(item)
            if not (cursor := page.get("next_cursor")):
                return

    async def export_types(self) -> builtins.list[ExportType]:  # `list` here would be the method
        return await self._run(flows.export_types(self._ctx))

    async def wait(self, task_id_or_token: str, *, max_wait: float = 300,
                   on_progress: ProgressCallback | None = None) -> Task:
        return await self._run(flows.wait(self._ctx, task_id_or_token, max_wait, on_progress))

    async def download(self, task_id_or_task: str | Task, dest: core.Dest, *, resume: bool = True,
                       attempts: int = 5) -> Path | None:
        return await self._run(flows.download(self._ctx, task_id_or_task, dest, resume, attempts))
