"""What the sync and the async client share: building requests and reading answers, free of I/O.

Each client runs the same loops around this core, one with blocking calls and one
with awaits, so the policy (what to retry, how long to wait, what each answer
means) lives here once.
"""
from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urljoin, urlsplit

import httpx

from exports_client import polling
from exports_client.errors import (
    ApiError,
    DownloadError,
    NotFound,
    RateLimited,
    Unavailable,
)
from exports_client.models import Task
from exports_client.version import __version__

Dest = str | os.PathLike[str] | BinaryIO  # where a download goes: a path or a binary file object
RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENCY_IN_FLIGHT = 40902  # the same key is still being handled: the gateway asks to retry shortly
TRANSPORT_ERRORS = (httpx.TransportError,)
USER_AGENT = f"exports-client/{__version__}"


@dataclass(frozen=True)
class Call:
    """One API request; `retry_in_flight` when a 409 'same key in flight' may be retried (a submit)."""

    method: str
    path: str
    params: dict[str, str] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    retry_in_flight: bool = False


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    url = base_url or os.environ.get("EXPORTS_URL") or ""
    key = api_key or os.environ.get("EXPORTS_API_KEY") or ""
    if not url:
        raise ValueError("name the gateway: pass base_url or set EXPORTS_URL")
    if not key:
        raise ValueError("pass api_key or set EXPORTS_API_KEY")
    return url.rstrip("/"), key


def task_path(task_id: str, suffix: str = "") -> str:
    return f"/api/v1/exports/{quote(task_id, safe='')}{suffix}"


def submit_call(export_type: str, filters: Mapping[str, Any] | None, format: str | None, timeout_sec: int | None,
                callback_url: str | None, idempotency_key: str | None) -> Call:
    body: dict[str, Any] = {"export_type": export_type}
    optional = {"filters": dict(filters) if filters is not None else None, "format": format,
                "timeout_sec": timeout_sec, "callback_url": callback_url}
    body.update({k: v for k, v in optional.items() if v is not None})
    # one key for every try of this submission: a retry after a lost answer replays, never creates a second task
    key = idempotency_key or f"sdk-{uuid.uuid4()}"
    return Call("POST", "/api/v1/exports", json=body, headers={"Idempotency-Key": key}, retry_in_flight=True)


def retry_after_of(resp: httpx.Response) -> float | None:
    return polling.parse_retry_after(resp.headers.get("retry-after"))


def error_of(resp: httpx.Response) -> ApiError:
    """The typed error for a refused answer, with the envelope's code, message and data."""
    code: int | None = None
    message = resp.reason_phrase or f"HTTP {resp.status_code}"
    data: Any = None
    try:
        body = resp.json()
        if isinstance(body, dict):
            code = body.get("code") if isinstance(body.get("code"), int) else None
            message = str(body.get("message") or message)
            data = body.get("data")
    except ValueError:
        pass
    kind = {404: NotFound, 429: RateLimited}.get(resp.status_code)
    if kind is None:
        kind = Unavailable if resp.status_code in (502, 503, 504) else ApiError
    return kind(resp.status_code, code, message, data, retry_after_of(resp))


def unreachable(base_url: str, exc: Exception) -> Unavailable:
    return Unavailable(None, None, f"could not reach {base_url}: {type(exc).__name__}: {exc}")


def data_of(resp: httpx.Response) -> Any:
    if not resp.is_success:
        raise error_of(resp)
    return resp.json()["data"]


def is_retryable(resp: httpx.Response, call: Call) -> bool:
    if resp.status_code in RETRY_STATUSES:
        return True
    return call.retry_in_flight and resp.status_code == 409 and _code(resp) == IDEMPOTENCY_IN_FLIGHT


EVENT_STREAM = "text/event-stream"
NO_SUCH_ROUTE = 40400  # the gateway has no such route (an older one, or the route was removed): poll instead
# answers that say this gateway serves no event stream here: the client polls instead
STREAMLESS_STATUSES = frozenset({405, 406})


def is_event_stream(resp: httpx.Response) -> bool:
    media = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return resp.status_code == 200 and media == EVENT_STREAM


def streams_unsupported(resp: httpx.Response) -> bool:
    """Whether an answer to an event stream's request means "no streams here" (404 without a task's own code,
    405, 406, or a success that is not an event stream), rather than a refusal to report."""
    if resp.status_code == 404:
        return _code(resp) in (NO_SUCH_ROUTE, None)
    return resp.status_code in STREAMLESS_STATUSES or resp.is_success


def event_data(data: str) -> Any:
    """The task in an event's data: the envelope the status route answers."""
    body = json.loads(data)
    if not isinstance(body, dict) or not isinstance(body.get("data"), dict):
        raise ValueError("an event's data is not a task envelope")
    return body["data"]


def _code(resp: httpx.Response) -> int | None:
    try:
        code = resp.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, int) else None


@dataclass
class RetryPolicy:
    """Bounded, jittered retries of one request: `retries` more tries within `max_wait_sec` of waiting."""

    retries: int = 3
    max_wait_sec: float = 60.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None, waited: float) -> float | None:
        """Seconds before try `attempt + 1`, or None to give up."""
        if attempt > self.retries:
            return None
        if retry_after is not None:
            delay = polling.honour(retry_after, self.rng)
        else:
            delay = polling.full_jitter(attempt - 1, self.rng, floor=0.2, ceiling=8.0)
        return delay if waited + delay <= self.max_wait_sec else None


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def link(base_url: str, task: Task) -> tuple[str, int]:
    """The task's signed download URL and the file's size in bytes."""
    if task.status != "COMPLETED" or task.result is None:
        raise DownloadError(f"task {task.task_id} is {task.status}; only a COMPLETED task has a file")
    return urljoin(base_url + "/", task.result.download_url), task.result.bytes


LINK_REFUSED = frozenset({403, 410})  # a signed link that expired (or whose secret rotated): ask for a fresh one
# a backend may answer a download with a redirect to a presigned object-store URL (download_redirect)
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 3


def not_streamed(resp: httpx.Response) -> bool:
    """An answer the flow decides on (a refused link, a redirect) rather than a file to write."""
    return resp.status_code in LINK_REFUSED or resp.status_code in REDIRECTS


def same_origin(a: str, b: str) -> bool:
    x, y = urlsplit(a), urlsplit(b)
    return (x.scheme, x.netloc) == (y.scheme, y.netloc)


class FileChanged(Exception):
    """A resumed transfer's file is not the one the partial file holds the start of: the sink started over."""


class Sink:
    """Where a download goes: a path (through `<path>.part`, renamed when whole) or a binary file object.

    `written` counts the file's bytes already in place: a `.part` left by an interrupted
    run of the same task counts too, so a later call resumes it instead of starting over.
    The part file is keyed, in `<path>.part.json`, to the task and to the file's identity
    (the ETag of the answer that began it): a part of another task, or of no known task,
    is started over, a resume asks `If-Range` with that ETag, and a range of a file with
    another ETag starts over too (FileChanged), so the result is never two files mixed.
    """

    def __init__(self, dest: str | os.PathLike[str] | BinaryIO, resume: bool, task_id: str = "") -> None:
        self.path: Path | None = None
        self.task_id = task_id
        self.etag: str | None = None
        if isinstance(dest, (str, os.PathLike)):
            self.path = Path(dest)
            self.part = self.path.with_name(self.path.name + ".part")
            self.meta = self.path.with_name(self.path.name + ".part.json")
            known = self._known() if resume else None
            if known is None or known.get("task_id") != task_id:
                self.part.unlink(missing_ok=True)
            else:
                etag = known.get("etag")
                self.etag = etag if isinstance(etag, str) else None
            self.file: BinaryIO = open(self.part, "ab")  # noqa: SIM115 (closed by close(), after the transfer)
            self.base = 0
            self.written = self.file.tell()
            if not self.written:
                self._remember(None)
        else:
            self.file = dest
            self.base = dest.tell() if dest.seekable() else 0
            self.written = 0

    def _known(self) -> dict[str, Any] | None:
        try:
            known = json.loads(self.meta.read_text())
        except (OSError, ValueError):
            return None
        return known if isinstance(known, dict) else None

    def _remember(self, etag: str | None) -> None:
        self.etag = etag
        if self.path is not None:
            self.meta.write_text(json.dumps({"task_id": self.task_id, "etag": etag}))

    def headers(self) -> dict[str, str]:
        if not self.written:
            return {}
        # If-Range wants a strong validator (RFC 9110 13.1.5); without one the task's key is the only check
        if self.etag is not None and not self.etag.startswith("W/"):
            return {"Range": f"bytes={self.written}-", "If-Range": self.etag}
        return {"Range": f"bytes={self.written}-"}

    def accept(self, resp: httpx.Response) -> None:
        """Check the answer continues where the file stops; a full answer (200) starts the file over."""
        etag = resp.headers.get("etag")
        if resp.status_code == 206:
            start = _range_start(resp.headers.get("content-range", ""))
            if start != self.written:
                raise DownloadError(f"asked for bytes from {self.written}, got a range from {start}")
            if self.etag is not None and etag is not None and etag != self.etag:
                self._restart()
                raise FileChanged(f"the file changed since its first bytes were written ({self.etag} -> {etag})")
        elif resp.status_code == 200:
            if self.written:
                self._restart()
            self._remember(etag)
        else:
            raise error_of(resp)

    def _restart(self) -> None:
        if not self.file.seekable():
            raise DownloadError("the server sent another file than the one begun and the destination cannot rewind")
        self.file.seek(self.base)
        self.file.truncate()
        self.written = 0
        self._remember(None)

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.written += len(chunk)

    def finish(self, expected: int) -> Path | None:
        self.file.flush()
        if self.written != expected:
            raise DownloadError(f"received {self.written} bytes, the task's result has {expected}")
        if self.path is None:
            name = getattr(self.file, "name", None)
            return Path(name) if isinstance(name, str) else None
        self.file.close()
        self.part.replace(self.path)
        self.meta.unlink(missing_ok=True)
        return self.path

    def close(self) -> None:
        if self.path is not None and not self.file.closed:
            self.file.close()


def _range_start(content_range: str) -> int | None:
    # "bytes 100-199/200"
    unit, _, spec = content_range.partition(" ")
    first = spec.split("-", 1)[0]
    return int(first) if unit == "bytes" and first.isascii() and first.isdigit() else None  # not '²'
