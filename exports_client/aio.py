"""The asyncio client: `AsyncExportsClient`, the same methods as `ExportsClient`, awaited."""
from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from exports_client import core, flows, sse
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
                 rng: random.Random | None = None, streams: bool = True) -> None:
        self.base_url, api_key = core.resolve(base_url, api_key)
        rng = rng or random.Random()
        self._ctx = flows.Context(self.base_url, api_key, core.RetryPolicy(retries=retries, rng=rng), rng, clock)
        self._sleep = sleep
        self._streams = streams  # False: wait polls the status route, never opening an event stream
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport,
                                       headers={"User-Agent": core.USER_AGENT})

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, flow: flows.Flow[T], on_emit: ProgressCallback | None = None) -> T:
        """Carry out a flow's steps; each task it emits goes to `on_emit`."""
        result: list[T] = []
        async for task in self._steps(flow, result):
            if on_emit is not None:
                on_emit(task)
        return result[0]

    async def _steps(self, flow: flows.Flow[T], result: list[T]) -> AsyncIterator[Task]:
        """Carry out a flow's steps with awaits, yielding the tasks it emits and appending its value to `result`;
        an error goes back into the flow."""
        reply: flows.Reply = None
        failure: Exception | None = None
        events = _Events()
        try:
            while True:
                try:
                    step = flow.throw(failure) if failure is not None else flow.send(reply)
                except StopIteration as done:
                    result.append(done.value)
                    return
                reply, failure = None, None
                if isinstance(step, flows.Emit):
                    yield step.task
                    continue
                try:
                    if isinstance(step, flows.Sleep):
                        await self._sleep(step.seconds)
                    elif isinstance(step, flows.Stream):
                        reply = await self._stream(step)
                    elif isinstance(step, flows.OpenEvents):
                        reply = await events.open(self._http, step, core.auth_headers(self._ctx.api_key))
                    elif isinstance(step, flows.NextEvent):
                        reply = await events.next(step.deadline - self._ctx.clock())
                    elif isinstance(step, flows.CloseEvents):
                        await events.close()
                    else:
                        reply = await self._http.request(step.method, step.path, params=step.params, json=step.json,
                                                         headers={**core.auth_headers(self._ctx.api_key),
                                                                  **step.headers})
                except Exception as exc:  # noqa: BLE001 (back into the flow: it retries transport errors and re-raises the rest after its cleanup)
                    failure = exc
        finally:
            await events.close()

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
        return await self._run(flows.wait(self._ctx, task_id_or_token, max_wait, self._streams), on_progress)

    async def watch(self, task_id: str, *, max_wait: float = 3600) -> AsyncIterator[Task]:
        """Each state of the task as it changes, from its current one to its terminal one (then it stops)."""
        result: list[Task] = []
        async for task in self._steps(flows.wait(self._ctx, task_id, max_wait, self._streams), result):
            yield task
        yield result[0]

    async def download(self, task_id_or_task: str | Task, dest: core.Dest, *, resume: bool = True,
                       attempts: int = 5) -> Path | None:
        return await self._run(flows.download(self._ctx, task_id_or_task, dest, resume, attempts))


class _Events:
    """The open event stream of an async client's wait, read line by line."""

    def __init__(self) -> None:
        self._stream: contextlib.AbstractAsyncContextManager[httpx.Response] | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._lines: collections.deque[str] = collections.deque()
        self._splitter, self._parser = sse.LineSplitter(), sse.EventParser()

    async def open(self, http: httpx.AsyncClient, step: flows.OpenEvents, auth: dict[str, str]) -> httpx.Response:
        await self.close()
        timeout = httpx.Timeout(http.timeout.connect, read=step.read_timeout, write=http.timeout.write,
                                pool=http.timeout.pool)
        self._stream = http.stream("GET", step.path, headers={**auth, **step.headers}, timeout=timeout)
        resp = await self._stream.__aenter__()
        if not core.is_event_stream(resp):
            await resp.aread()
        self._chunks, self._parser, self._splitter = resp.aiter_bytes(), sse.EventParser(), sse.LineSplitter()
        self._lines.clear()
        return resp

    async def next(self, within: float) -> sse.Event | sse.Heartbeat | None:
        """The next event or heartbeat; None once the stream has ended; a heartbeat when `within` runs out first
        (the flow then sees its deadline passed)."""
        assert self._chunks is not None, "a stream is open"
        try:
            async with asyncio.timeout(max(0.0, within)):
                while True:
                    while self._lines:
                        item = self._parser.feed(self._lines.popleft())
                        if item is not None:
                            return item
                    chunk = await anext(self._chunks, None)
                    if chunk is None:
                        return None
                    self._lines.extend(self._splitter.feed(chunk))
        except TimeoutError:
            self._chunks = None  # cut mid-read: the stream is no longer readable
            return sse.HEARTBEAT

    async def close(self) -> None:
        stream, self._stream, self._chunks = self._stream, None, None
        if stream is not None:
            await stream.__aexit__(None, None, None)
