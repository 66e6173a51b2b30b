"""Every client operation as a generator of steps, driven by the sync and the async client alike.

A flow yields what it needs done (`Sleep`, a `Call`, a `Stream` of a file, an event
stream's `OpenEvents` / `NextEvent` / `CloseEvents`, a task to `Emit` to the caller) and
receives the answer (or has the transport error thrown in), so the policy, what to
retry, how long to wait, when to give up, is written once; `ExportsClient` drives a
flow with blocking calls and `AsyncExportsClient` with awaits.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin

import httpx

from exports_client import core, polling, sse
from exports_client.errors import DownloadError, WaitTimeout
from exports_client.models import ExportType, Task

T = TypeVar("T")
# "could not reach the gateway; retrying": a warning while a request or a wait is retried (exportctl prints them)
log = logging.getLogger("exports_client")
# an event stream sends a comment at least every 15 s: a read waits for a few of them before calling it cut
STREAM_READ_TIMEOUT_SEC = 45.0
DEFAULT_RETRY_SEC = 3.0


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Stream:
    """GET `url` and write the body into `sink` (an answer the link refused comes back read, not written)."""

    url: str
    headers: dict[str, str]
    sink: core.Sink


@dataclass(frozen=True)
class OpenEvents:
    """Open an event stream (GET `path`): the answer comes back with its headers, its body still to read."""

    path: str
    headers: dict[str, str]
    read_timeout: float  # the longest wait for a line: a few heartbeats, cut to the wait's deadline


@dataclass(frozen=True)
class NextEvent:
    """The open stream's next event or heartbeat (None once it has ended); give up at `deadline` (clock time)."""

    deadline: float


@dataclass(frozen=True)
class CloseEvents:
    pass


@dataclass(frozen=True)
class Emit:
    """A task state for the caller (wait's on_progress, watch's next item); the flow goes on at once."""

    task: Task


Step = Sleep | core.Call | Stream | OpenEvents | NextEvent | CloseEvents | Emit
Reply = httpx.Response | sse.Event | sse.Heartbeat | None
Flow = Generator[Step, Reply, T]


@dataclass(frozen=True)
class Context:
    base_url: str
    api_key: str
    policy: core.RetryPolicy
    rng: random.Random
    clock: Callable[[], float]


def send(ctx: Context, call: core.Call) -> Flow[httpx.Response]:
    """One request, retried on transport errors, 429, 502-504 (and a submit's 409 in flight), within bounds."""
    attempt, waited = 1, 0.0
    while True:
        try:
            resp = yield call
        except core.TRANSPORT_ERRORS as exc:
            delay = ctx.policy.delay(attempt, None, waited)
            if delay is None:
                raise core.unreachable(ctx.base_url, exc) from exc
            retrying(ctx, exc, delay)
        else:
            assert isinstance(resp, httpx.Response)
            if not core.is_retryable(resp, call):
                return resp
            delay = ctx.policy.delay(attempt, core.retry_after_of(resp), waited)
            if delay is None:
                raise core.error_of(resp)
        yield Sleep(delay)
        attempt, waited = attempt + 1, waited + delay


def retrying(ctx: Context, exc: Exception, delay: float) -> None:
    log.warning("could not reach the gateway at %s (%s: %s); retrying in %.1f s", ctx.base_url,
                type(exc).__name__, exc, delay)


def data(ctx: Context, call: core.Call) -> Flow[Any]:
    return core.data_of((yield from send(ctx, call)))


def task(ctx: Context, call: core.Call) -> Flow[Task]:
    return Task.from_dict((yield from data(ctx, call)))


def get(ctx: Context, task_id: str) -> Flow[Task]:
    return (yield from task(ctx, core.Call("GET", core.task_path(task_id))))


def export_types(ctx: Context) -> Flow[list[ExportType]]:
    page = yield from data(ctx, core.Call("GET", "/api/v1/export-types"))
    return [ExportType.from_dict(item) for item in page["items"]]


def list_page(ctx: Context, status: str | None, page_size: int, cursor: str | None) -> Flow[Any]:
    params = {"limit": str(page_size), **({"status": status} if status else {}),
              **({"cursor": cursor} if cursor else {})}
    return (yield from data(ctx, core.Call("GET", "/api/v1/exports", params=params)))


def wait(ctx: Context, task_id_or_token: str, max_wait: float, use_stream: bool = True) -> Flow[Task]:
    """Follow the task's event stream until it ends, else poll (polling.finished); each state on the way is
    emitted. At `max_wait` raise WaitTimeout, whose token resumes the plan."""
    started = ctx.clock()
    plan = polling.plan_for(task_id_or_token, started, max_wait, ctx.rng)
    if use_stream and not polling.is_token(task_id_or_token):
        done = yield from follow(ctx, plan, started)
        if done is not None:
            return done
    return (yield from poll(ctx, plan, started))


def follow(ctx: Context, plan: polling.PollPlan, started: float) -> Flow[Task | None]:
    """The task through its event stream: the final state, or None when streams cannot serve this wait (an older
    gateway, a refusal, a stream that keeps breaking); then the caller polls, from the pace `plan` holds.

    After a break it reconnects with Last-Event-ID after a jittered pause that grows with consecutive breaks
    (from the stream's `retry:`), so a gateway restart does not bring every client back in the same second.
    """
    last_id: str | None = None
    retry_sec, breaks = DEFAULT_RETRY_SEC, 0
    failure: Exception | None = None  # why the last reconnect failed
    while True:
        remaining = plan.deadline - ctx.clock()
        if remaining <= 0:
            raise WaitTimeout(plan.last, plan.token(), ctx.clock() - started)
        headers = {"Accept": core.EVENT_STREAM, **({"Last-Event-ID": last_id} if last_id else {})}
        try:
            resp = yield OpenEvents(core.task_path(plan.task_id, "/events"), headers,
                                    min(STREAM_READ_TIMEOUT_SEC, remaining + 0.1))
        except core.TRANSPORT_ERRORS as exc:
            resp, failure = None, exc
        if isinstance(resp, httpx.Response) and not core.is_event_stream(resp):
            yield CloseEvents()
            if core.streams_unsupported(resp):
                return None
            if resp.status_code in core.RETRY_STATUSES:  # 429, 503: poll, at the pace the gateway asked
                plan.refused(ctx.clock(), core.retry_after_of(resp))
                return None
            raise core.error_of(resp)
        if isinstance(resp, httpx.Response):
            try:
                while True:
                    item = yield NextEvent(plan.deadline)
                    if item is None:
                        break
                    if ctx.clock() >= plan.deadline:
                        raise WaitTimeout(plan.last, plan.token(), ctx.clock() - started)
                    if not isinstance(item, sse.Event) or item.event != "status":
                        continue
                    current = task_of(item)
                    breaks, last_id = 0, sse.resumable(item.id) or last_id
                    retry_sec = item.retry_ms / 1000 if item.retry_ms else retry_sec
                    plan.last = current
                    if current.terminal:
                        return current
                    yield Emit(current)
            except (*core.TRANSPORT_ERRORS, sse.BrokenStream):
                pass  # cut, broken, or quiet past the deadline: reconnect (then poll), or time out just below
            finally:
                yield CloseEvents()
        breaks += 1
        if breaks > ctx.policy.retries + 1:
            return None
        if ctx.clock() >= plan.deadline:
            raise WaitTimeout(plan.last, plan.token(), ctx.clock() - started)
        pause = min(plan.deadline - ctx.clock(), polling.full_jitter(breaks - 1, ctx.rng, floor=0.1,
                                                                     ceiling=retry_sec * 2 ** breaks))
        if failure is not None:
            retrying(ctx, failure, pause)
            failure = None
        yield Sleep(pause)


def task_of(event: sse.Event) -> Task:
    """The task a status event carries; BrokenStream when its data is not one (the stream is not followed)."""
    try:
        return Task.from_dict(core.event_data(event.data))
    except (ValueError, TypeError) as exc:
        raise sse.BrokenStream(f"a status event that is not a task: {exc}"[:200]) from None


def poll(ctx: Context, plan: polling.PollPlan, started: float) -> Flow[Task]:
    call = core.Call("GET", core.task_path(plan.task_id))
    while True:
        pause = plan.sleep_before_poll(ctx.clock())
        if pause is None:
            yield Sleep(max(0.0, plan.deadline - ctx.clock()))
            raise WaitTimeout(plan.last, plan.token(), ctx.clock() - started)
        yield Sleep(pause)
        try:
            resp = yield call
        except core.TRANSPORT_ERRORS as exc:
            plan.transport_failures += 1
            if plan.transport_failures > ctx.policy.retries:
                raise core.unreachable(ctx.base_url, exc) from exc
            now = ctx.clock()
            plan.refused(now, None)
            retrying(ctx, exc, plan.not_before - now)
            continue
        assert isinstance(resp, httpx.Response)
        if core.is_retryable(resp, call):
            plan.refused(ctx.clock(), core.retry_after_of(resp))
            continue
        current, retry_after = Task.from_dict(core.data_of(resp)), core.retry_after_of(resp)
        if polling.finished(current, retry_after):
            return current
        plan.answered(ctx.clock(), current, retry_after)
        yield Emit(current)


def download(ctx: Context, task_id_or_task: str | Task, dest: core.Dest, resume: bool,
             attempts: int) -> Flow[Path | None]:
    """Stream the result into `dest`, resuming with Range after a cut; a refused link is fetched afresh."""
    current = (yield from get(ctx, task_id_or_task)) if isinstance(task_id_or_task, str) else task_id_or_task
    url, expected = core.link(ctx.base_url, current)
    sink = core.Sink(dest, resume, current.task_id)
    try:
        for attempt in range(1, attempts + 1):
            if sink.written >= expected:
                break
            try:
                resp = yield from _fetch(ctx, url, sink)
            except core.FileChanged:  # the sink started over: the next try fetches the file whole
                continue
            except core.TRANSPORT_ERRORS as exc:
                if attempt == attempts:  # named without its query: the signature is a credential
                    raise core.unreachable(url.split("?", 1)[0], exc) from exc
                yield Sleep(polling.full_jitter(attempt - 1, ctx.rng, floor=0.2, ceiling=8.0))
                continue
            if resp.status_code in core.LINK_REFUSED:
                if attempt == attempts:
                    raise core.error_of(resp)
                url, expected = core.link(ctx.base_url, (yield from get(ctx, current.task_id)))
        return sink.finish(expected)
    finally:
        sink.close()


def _fetch(ctx: Context, url: str, sink: core.Sink) -> Flow[httpx.Response]:
    """GET `url` into `sink`, following a redirect to the object store by hand: the API key goes only to
    the gateway's origin (httpx's own following would keep it on an http-to-https hop to the same host)."""
    for _ in range(core.MAX_REDIRECTS + 1):
        auth = core.auth_headers(ctx.api_key) if core.same_origin(url, ctx.base_url) else {}
        resp = yield Stream(url, {**auth, **sink.headers()}, sink)
        assert isinstance(resp, httpx.Response)
        location = resp.headers.get("location")
        if resp.status_code not in core.REDIRECTS or not location:
            return resp
        url = urljoin(url, location)
    raise DownloadError(f"more than {core.MAX_REDIRECTS} redirects from {url.split('?', 1)[0]}")


def submit(ctx: Context, export_type: str, filters: Mapping[str, Any] | None, format: str | None,
           timeout_sec: int | None, callback_url: str | None, idempotency_key: str | None) -> Flow[Task]:
    call = core.submit_call(export_type, filters, format, timeout_sec, callback_url, idempotency_key)
    return (yield from task(ctx, call))
