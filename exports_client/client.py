"""The blocking client: `ExportsClient`. `AsyncExportsClient` (exports_client.aio) has the same methods."""
from __future__ import annotations

import builtins
import collections
import contextlib
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from exports_client import core, flows, sse
from exports_client.models import ExportType, Task
from exports_client.webhooks import verify_webhook

T = TypeVar("T")
ProgressCallback = Callable[[Task], None]


class ExportsClient:
    """Submit, poll, cancel and download exports through the gateway.

    `clock`, `sleep` and `rng` are injectable so the timing policy can run on a
    simulated clock; `transport` takes any httpx transport (a test double, a proxy).
    `streams=False` makes `wait` and `watch` poll instead of following the task's event
    stream (for a network that cuts long answers).
    """

    verify_webhook = staticmethod(verify_webhook)

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 10.0,
                 retries: int = 3, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None, streams: bool = True) -> None:
        self.base_url, api_key = core.resolve(base_url, api_key)
        rng = rng or random.Random()
        self._ctx = flows.Context(self.base_url, api_key, core.RetryPolicy(retries=retries, rng=rng), rng, clock)
        self._sleep = sleep
        self._streams = streams  # False: wait polls the status route, never opening an event stream
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers={"User-Agent": core.USER_AGENT})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, flow: flows.Flow[T], on_emit: ProgressCallback | None = None) -> T:
        """Carry out a flow's steps; each task it emits goes to `on_emit`."""
        steps = self._steps(flow)
        while True:
            try:
                task = next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if on_emit is not None:
                on_emit(task)

    def _steps(self, flow: flows.Flow[T]) -> Generator[Task, None, T]:
        """Carry out a flow's steps with blocking calls, yielding the tasks it emits; an error goes back into
        the flow."""
        reply: flows.Reply = None
        failure: Exception | None = None
        events = _Events()
        try:
            while True:
                try:
                    step = flow.throw(failure) if failure is not None else flow.send(reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                reply, failure = None, None
                if isinstance(step, flows.Emit):
                    yield step.task
                    continue
                try:
                    if isinstance(step, flows.Sleep):
                        self._sleep(step.seconds)
                    elif isinstance(step, flows.Stream):
                        reply = self._stream(step)
                    elif isinstance(step, flows.OpenEvents):
                        reply = events.open(self._http, step, core.auth_headers(self._ctx.api_key))
                    elif isinstance(step, flows.NextEvent):
                        reply = events.next(step.deadline, self._ctx.clock)
                    elif isinstance(step, flows.CloseEvents):
                        events.close()
                    else:
                        reply = self._http.request(step.method, step.path, params=step.params, json=step.json,
                                                   headers={**core.auth_headers(self._ctx.api_key), **step.headers})
                except Exception as exc:  # noqa: BLE001 (back into the flow: it retries transport errors and re-raises the rest after its cleanup)
                    failure = exc
        finally:
            events.close()

    def _stream(self, step: flows.Stream) -> httpx.Response:
        """A download's body into its sink."""
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
        """Follow the task's event stream (polling where streams are not served) until it is terminal; after
        `max_wait` s raise WaitTimeout (its token resumes here, by polling)."""
        return self._run(flows.wait(self._ctx, task_id_or_token, max_wait, self._streams), on_progress)

    def watch(self, task_id: str, *, max_wait: float = 3600) -> Iterator[Task]:
        """Each state of the task as it changes, from its current one to its terminal one (then it stops)."""
        final = yield from self._steps(flows.wait(self._ctx, task_id, max_wait, self._streams))
        yield final

    def download(self, task_id_or_task: str | Task, dest: core.Dest, *, resume: bool = True,
                 attempts: int = 5) -> Path | None:
        """Stream the result to `dest`; an interrupted transfer goes on with Range. Returns the path written."""
        return self._run(flows.download(self._ctx, task_id_or_task, dest, resume, attempts))


class _Events:
    """The open event stream of a blocking client's wait, read line by line."""

    def __init__(self) -> None:
        self._stream: contextlib.AbstractContextManager[httpx.Response] | None = None
        self._chunks: Iterator[bytes] | None = None
        self._lines: collections.deque[str] = collections.deque()
        self._splitter, self._parser = sse.LineSplitter(), sse.EventParser()

    def open(self, http: httpx.Client, step: flows.OpenEvents, auth: dict[str, str]) -> httpx.Response:
        self.close()
        timeout = httpx.Timeout(http.timeout.connect, read=step.read_timeout, write=http.timeout.write,
                                pool=http.timeout.pool)
        self._stream = http.stream("GET", step.path, headers={**auth, **step.headers}, timeout=timeout)
        resp = self._stream.__enter__()
        if not core.is_event_stream(resp):
            resp.read()
        self._chunks, self._parser, self._splitter = resp.iter_bytes(), sse.EventParser(), sse.LineSplitter()
        self._lines.clear()
        return resp

    def next(self, deadline: float, clock: Callable[[], float]) -> sse.Event | sse.Heartbeat | None:
        """The next event or heartbeat; None once the stream has ended; a heartbeat once `deadline` has passed
        (the flow then sees it), however the server trickles. A read waits at most the stream's read timeout."""
        assert self._chunks is not None, "a stream is open"
        while True:
            while self._lines:
                item = self._parser.feed(self._lines.popleft())
                if item is not None:
                    return item
            if clock() >= deadline:
                return sse.HEARTBEAT
            chunk = next(self._chunks, None)
            if chunk is None:
                return None
            self._lines.extend(self._splitter.feed(chunk))

    def close(self) -> None:
        stream, self._stream, self._chunks = self._stream, None, None
        if stream is not None:
            stream.__exit__(None, None, None)
