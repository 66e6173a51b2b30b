"""Every client operation as a generator of steps, driven by the sync and the async client alike.

A flow yields what it needs done (`Sleep`, a `Call`, a `Stream` of a file) and
receives the answer (or has the transport error thrown in), so the policy, what to
retry, how long to wait, when to give up, is written once; `ExportsClient` drives a
flow with blocking calls and `AsyncExportsClient` with awaits.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urljoin

import httpx

from exports_client import core, polling
from exports_client.errors import DownloadError, WaitTimeout
from exports_client.models import ExportType, Task

T = TypeVar("T")


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Stream:
    """GET `url` and write the body into `sink` (an answer the link refused comes back read, not written)."""

    url: str
    headers: dict[str, str]
    sink: core.Sink


Step = Sleep | core.Call | Stream
Flow = Generator[Step, httpx.Response | None, T]


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
        else:
            assert resp is not None
            if not core.is_retryable(resp, call):
                return resp
            delay = ctx.policy.delay(attempt, core.retry_after_of(resp), waited)
            if delay is None:
                raise core.error_of(resp)
        yield Sleep(delay)
        attempt, waited = attempt + 1, waited + delay


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


def wait(ctx: Context, task_id_or_token: str, max_wait: float,
         on_progress: Callable[[Task], None] | None) -> Flow[Task]:
    """Poll until the task ends (polling.finished); at `max_wait` raise WaitTimeout, whose token resumes the plan."""
    started = ctx.clock()
    plan = polling.plan_for(task_id_or_token, started, max_wait, ctx.rng)
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
            plan.refused(ctx.clock(), None)
            continue
        assert resp is not None
        if core.is_retryable(resp, call):
            plan.refused(ctx.clock(), core.retry_after_of(resp))
            continue
        current, retry_after = Task.from_dict(core.data_of(resp)), core.retry_after_of(resp)
        if polling.finished(current, retry_after):
            return current
        plan.answered(ctx.clock(), current, retry_after)
        if on_progress is not None:
            on_progress(current)


def download(ctx: Context, task_id_or_task: str | Task, dest: core.Dest, resume: bool,
             attempts: int) -> Flow[Path | None]:
    """Stream the result into `dest`, resuming with Range after a cut; a refused link is fetched afresh."""
    current = (yield from get(ctx, task_id_or_task)) if isinstance(task_id_or_task, str) else task_id_or_task
    url, expected = core.link(ctx.base_url, current)
    sink = core.Sink(dest, resume)
    try:
        for attempt in range(1, attempts + 1):
            if sink.written >= expected:
                break
            try:
                resp = yield from _fetch(ctx, url, sink)
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
        assert resp is not None
        location = resp.headers.get("location")
        if resp.status_code not in core.REDIRECTS or not location:
            return resp
        url = urljoin(url, location)
    raise DownloadError(f"more than {core.MAX_REDIRECTS} redirects from {url.split('?', 1)[0]}")


def submit(ctx: Context, export_type: str, filters: Mapping[str, Any] | None, format: str | None,
           timeout_sec: int | None, callback_url: str | None, idempotency_key: str | None) -> Flow[Task]:
    call = core.submit_call(export_type, filters, format, timeout_sec, callback_url, idempotency_key)
    return (yield from task(ctx, call))
