"""`source: {kind: http, url, method, timeout_sec, headers}`: a slow synchronous HTTP endpoint as an export type.

Each attempt makes one call: the submitted filters as the JSON body (POST) or as the query
(GET: each filter, a list repeated), with `Idempotency-Key: <task id>` (the same on every
attempt, so an endpoint that honours it acts once) and `X-Tenant-Id`. A 2xx answer's body is
the result file, copied as it arrives (memory stays flat whatever its size), its Content-Type
kept. What any other answer means:
- 408, 425, 429: another attempt, after at least the endpoint's Retry-After;
- 5xx, the call outliving `timeout_sec`, a connection error: another attempt, after a backoff;
- any other 4xx, and any 3xx (redirects are not followed): FAILED, not retryable, with the
  endpoint's status and the start of its message.
The call is bounded by min(`timeout_sec`, the task's remaining time); past the task's, the
task is TIMEOUT. It runs on an event loop of the attempt's own, in the worker thread, polled
a few times a second, so a cancel or a deadline closes the connection at once, even while the
endpoint is still thinking. The endpoint's address must pass the callbacks' rules (public
addresses only) unless `sources.allow_hosts` / `sources.allow_networks` allow it, judged on
every connect (the connection goes to the address that was judged).
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, Literal, TypeVar

import aiohttp
from pydantic import Field, field_validator

from backend_stub.config_model import Strict
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure, TransientFailure
from backend_stub.sources.base import SourceContext
from exports_common.backoff import backoff, retry_after_seconds
from exports_common.netpolicy import AddressPolicy, PinnedResolver, RefusedAddress

CHUNK_BYTES = 64 * 1024
POLL_SEC = 0.2  # how soon a cancel or a deadline closes the call
PREVIEW_BYTES = 200  # of a refusal's message, for the task's error
RETRY_LATER = frozenset({408, 425, 429})
BACKOFF_FIRST_SEC, BACKOFF_MAX_SEC = 1.0, 30.0
FALLBACK_MEDIA_TYPE = "application/octet-stream"
# a media type with parameters, as RFC 9110 writes it (anything else is served as octet-stream)
MEDIA_TYPE = re.compile(r"^[\w.+-]+/[\w.+-]+(\s*;\s*[\w.+-]+=(\"[^\"\\\r\n]*\"|[\w.+-]+))*$")
SET_BY_THE_SOURCE = frozenset({"idempotency-key", "x-tenant-id", "host", "content-length", "transfer-encoding",
                               "content-type", "connection"})
T = TypeVar("T")


class HttpSource(Strict):
    """A slow endpoint called once per attempt; its answer's body is the result (`formats: [raw]`)."""

    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://[^/\s?#]+(/[^\s#]*)?$", description="the endpoint (http or https)")
    method: Literal["POST", "GET"] = Field("POST", description="POST: filters as the JSON body; GET: as the query")
    timeout_sec: float = Field(60.0, gt=0, le=86_400, description=(
        "one call's bound; past it the attempt is retried (past the task's own timeout the task is TIMEOUT)"))
    headers: dict[str, str] = Field(default_factory=dict, description="sent with every call (${ENV} for secrets)")

    @field_validator("headers")
    @classmethod
    def _own_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        taken = sorted(name for name in headers if name.lower() in SET_BY_THE_SOURCE)
        if taken:
            raise ValueError(f"headers {', '.join(taken)} are set by the source itself: remove them")
        return headers

    def known_columns(self) -> None:
        return None

    def expected_rows(self) -> None:
        return None

    def open_body(self, ctx: SourceContext, network: AddressPolicy) -> HttpBody:
        return HttpBody(self, ctx, network)


class HttpBody:
    """One attempt's call: entered, it has the answer's headers (or raised what the answer means)."""

    def __init__(self, config: HttpSource, ctx: SourceContext, network: AddressPolicy) -> None:
        self._config = config
        self._ctx = ctx
        self._network = network
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._response: aiohttp.ClientResponse | None = None
        self._deadline = min(time.monotonic() + config.timeout_sec, ctx.deadline)
        self.media_type = FALLBACK_MEDIA_TYPE
        self.length: int | None = None

    def __enter__(self) -> HttpBody:
        try:
            self._wait(self._call())
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def chunks(self) -> Iterator[bytes]:
        assert self._response is not None, "entered"
        content = self._response.content
        try:
            while chunk := self._wait(content.read(CHUNK_BYTES)):
                yield chunk
        except aiohttp.ClientError as exc:  # cut mid-body, or shorter than its Content-Length
            raise self._unreachable(exc) from None

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._release())
            self._loop.close()

    async def _release(self) -> None:
        if self._response is not None:
            self._response.close()  # not released to a pool: whatever is left unread goes with the connection
        if self._session is not None:
            await self._session.close()

    async def _call(self) -> None:
        """Make the call; `_response` holds the answer (kept before its status is judged, so `close` releases it
        whatever the status meant)."""
        connector = aiohttp.TCPConnector(resolver=PinnedResolver(self._network), use_dns_cache=False, limit=1)
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        config, ctx = self._config, self._ctx
        headers = {**config.headers, "Idempotency-Key": ctx.task_id, "X-Tenant-Id": ctx.tenant}
        filters = dict(ctx.filters)
        body: dict[str, Any] = {"json": filters} if config.method == "POST" else {"params": query_of(filters)}
        try:
            response = await self._session.request(config.method, config.url, headers=headers,
                                                   allow_redirects=False, **body)
        except aiohttp.ClientError as exc:
            raise self._unreachable(exc) from None
        self._response = response
        if 200 <= response.status < 300:
            self.media_type = kept_media_type(response.headers.get("Content-Type"))
            self.length = response.content_length
            return
        preview = (await response.content.read(PREVIEW_BYTES)).decode("utf-8", "replace").strip()
        said = f"the endpoint answered {response.status}" + (f": {preview}" if preview else "")
        if response.status in RETRY_LATER:
            raise TransientFailure(said, wait_sec=max(retry_after(response), attempt_backoff(ctx.attempt)))
        if response.status >= 500:
            raise TransientFailure(said, wait_sec=attempt_backoff(ctx.attempt))
        raise PermanentFailure("ENDPOINT_REFUSED", said)

    def _unreachable(self, exc: aiohttp.ClientError) -> Exception:
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, RefusedAddress):
            cause = cause.__cause__ or getattr(cause, "os_error", None)
        if cause is not None:
            return PermanentFailure("ENDPOINT_NOT_ALLOWED", f"{cause}: the endpoint's host may be called only if "
                                    f"sources.allow_hosts or sources.allow_networks in backend.yaml allows it")
        return TransientFailure(f"the endpoint could not be reached: {type(exc).__name__}: {exc}"[:300],
                                wait_sec=attempt_backoff(self._ctx.attempt))

    def _wait(self, step: Coroutine[Any, Any, T]) -> T:
        """Run `step` on this attempt's loop until it is done, or close it when the attempt must stop."""
        task = self._loop.create_task(step)
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining > 0 and not self._ctx.cancelled():
                self._loop.run_until_complete(asyncio.wait({task}, timeout=min(POLL_SEC, remaining)))
                if task.done():
                    return task.result()
                continue
            task.cancel()
            self._loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
            raise self._stopped()

    def _stopped(self) -> Exception:
        if time.monotonic() >= self._ctx.deadline:
            return DeadlineReached()
        if self._ctx.cancelled():
            return Cancelled()
        return TransientFailure(f"the endpoint did not finish within the source's timeout_sec "
                                f"({self._config.timeout_sec:g} s)", wait_sec=attempt_backoff(self._ctx.attempt))


def query_of(filters: dict[str, Any]) -> list[tuple[str, str]]:
    """Filters as query parameters: each once, a list's values repeated (a nested object is refused at submit)."""
    pairs: list[tuple[str, str]] = []
    for name, value in filters.items():
        for item in value if isinstance(value, list) else [value]:
            pairs.append((name, str(item)))
    return pairs


def kept_media_type(value: str | None) -> str:
    """The answer's Content-Type as the download will carry it, if it is one well-formed media type."""
    if value and len(value) <= 200 and MEDIA_TYPE.match(value.strip()):
        return value.strip()
    return FALLBACK_MEDIA_TYPE


def retry_after(response: aiohttp.ClientResponse) -> float:
    """The endpoint's Retry-After in seconds (at most a day; garbage counts as none)."""
    return min(retry_after_seconds(response.headers.get("Retry-After")) or 0.0, 86_400.0)


def attempt_backoff(attempt: int) -> float:
    """The pause before the next attempt: jittered, doubling with each attempt up to 30 s."""
    return backoff(max(0, attempt - 1), BACKOFF_FIRST_SEC, BACKOFF_MAX_SEC)
