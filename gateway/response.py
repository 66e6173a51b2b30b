"""The one response type that flows back through the plugin chain and out to the client.

A body is either bytes (JSON envelopes, cached answers), a stream straight from
the upstream (downloads), which is never held in memory, or an event stream the
gateway writes itself (`events`, gateway/plugins/events/).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, NamedTuple, Protocol

import orjson
from starlette.types import Receive, Scope, Send

from exports_common.envelope import JSON_TYPE, error_body, ok_body
from exports_common.errors import ApiError
from gateway.upstream import DEFAULT_MAX_ANSWER_BYTES, AnswerTooLarge

log = logging.getLogger("gateway")


class EventBody(Protocol):
    """A body the gateway writes itself for as long as it lasts (an event stream), given the final headers."""

    on_end: Callable[[int], None] | None  # called with the events sent, once the body has ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send,
                      headers: list[tuple[str, str]]) -> None: ...


class _Prepared(NamedTuple):
    headers: list[tuple[str, str]]  # the headers it was encoded from
    body: bytes
    raw: list[tuple[bytes, bytes]]  # those headers and the body's length, as sent


@dataclass(slots=True)
class GatewayResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    stream: AsyncIterator[bytes] | None = None
    release: Callable[[], Any] | None = None
    # the upstream client's own way to read the whole body at once (at most the bytes given), instead of
    # draining `stream` chunk by chunk
    whole: Callable[[int], Awaitable[bytes]] | None = None
    # the most `read` takes of a streamed body (the route's `max_answer_bytes`): past it, AnswerTooLarge
    max_read: int = DEFAULT_MAX_ANSWER_BYTES
    events: EventBody | None = None
    _json: Any = field(default=None, repr=False)
    _prepared: _Prepared | None = field(default=None, repr=False)

    @classmethod
    def envelope(cls, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> GatewayResponse:
        resp = cls(status, [("content-type", JSON_TYPE)], ok_body(data))
        for name, value in (headers or {}).items():
            resp.set_header(name, value)
        return resp

    @classmethod
    def error(cls, err: ApiError) -> GatewayResponse:
        resp = cls(err.kind.status, [("content-type", JSON_TYPE)], error_body(err))
        for name, value in err.headers.items():
            resp.set_header(name, value)
        return resp

    def copy(self) -> GatewayResponse:
        """A copy whose headers can change; only for an answer whose body is bytes."""
        resp = GatewayResponse(self.status, list(self.headers), self.body)
        resp._prepared = self._prepared
        return resp

    def prepare(self) -> GatewayResponse:
        """Encode this answer's headers once for all its copies (a cached answer sent again and again).

        A copy sends the encoded bytes while its body and those first headers are
        unchanged, and encodes only the headers added since (`x-request-id`).
        """
        assert self.body is not None, "only an answer whose body is bytes is copied"
        self._prepared = _Prepared(list(self.headers), self.body, self._raw_headers())
        return self

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def set_header(self, name: str, value: str) -> None:
        name = name.lower()
        for k, _ in self.headers:
            if k == name:
                self.headers = [(k, v) for k, v in self.headers if k != name]
                break
        self.headers.append((name, value))

    @property
    def is_json(self) -> bool:
        media = (self.header("content-type") or "").split(";", 1)[0].strip()
        return media == JSON_TYPE

    async def read(self) -> bytes:
        """The whole body, at most `max_read` bytes: past it, AnswerTooLarge (a 502) and the stream is closed."""
        if self.body is None:
            chunks = []
            try:
                if self.whole is not None:
                    chunks.append(await self.whole(self.max_read))
                elif self.stream is not None:
                    size = 0
                    async for chunk in self.stream:
                        size += len(chunk)
                        if size > self.max_read:
                            raise AnswerTooLarge(self.max_read)
                        chunks.append(chunk)
            finally:
                self.close()
            self.body = b"".join(chunks)
            self.stream = self.whole = None
        return self.body

    async def json(self) -> Any:
        """The parsed JSON body, or None when the body is not JSON."""
        if self._json is None and self.is_json:
            try:
                self._json = loads(await self.read())
            except ValueError:
                return None
        return self._json

    def replace_json(self, value: Any) -> None:
        self._json = value
        self.body = dumps(value)
        self.stream = self.whole = None
        self.headers = [(k, v) for k, v in self.headers if k != "content-length"]

    def close(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None

    def _raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers as sent: content-length from the body when it is bytes (the upstream's for a stream)."""
        prepared, headers = self._prepared, self.headers
        start, length = 0, None
        if prepared is not None and self.body is prepared.body and headers[:len(prepared.headers)] == prepared.headers:
            raw, start = prepared.raw.copy(), len(prepared.headers)
        else:
            raw = []
            length = str(len(self.body)) if self.body is not None else self.header("content-length")
        # a loop, not a comprehension: one header or two to encode are not worth a frame of their own
        for name, value in headers[start:] if start else headers:
            if name != "content-length":
                raw.append((name.encode("latin-1"), value.encode("latin-1")))
        if length is not None:
            raw.append((b"content-length", length.encode()))
        return raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.events is not None:
            await self.events(scope, receive, send, self.headers)
            return
        headers = self._raw_headers()
        head_only = scope.get("method") == "HEAD"
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": headers})
            if self.body is not None or self.stream is None or head_only:
                await send({"type": "http.response.body", "body": b"" if head_only else (self.body or b"")})
                return
            # uvicorn's send() returns quietly once the client is gone: without this, a download whose client left
            # would go on reading the whole file from the upstream into nowhere
            gone = asyncio.ensure_future(disconnected(receive))
            try:
                async for chunk in self.stream:
                    if gone.done() and gone.result():
                        return  # unread, the upstream connection is closed, not reused
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except Exception as exc:  # noqa: BLE001 - the status is sent: no envelope can follow, and no traceback should
                # returning without the last frame makes the server close the connection, so the client sees the
                # body cut short (a clean end would pass a truncated file off as whole)
                log.warning("the upstream stopped in the middle of a body; the client's connection is closed",
                            extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
                return
            finally:
                gone.cancel()
            await send({"type": "http.response.body", "body": b""})
        finally:
            if self.release is not None:  # most answers have nothing to release: no call for them
                self.close()


async def disconnected(receive: Receive) -> bool:
    """True once the client has gone away; False for a `receive` that never waits (a test double, not a server).

    A streamed answer comes after its request was sent upstream whole (or the upstream answered early and
    the rest of the body is of no use), so nothing else reads `receive` by then.
    """
    ended = False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True
        if not message.get("more_body", False):
            if ended:  # a server waits for the disconnect once the body has ended; this one answered again
                return False
            ended = True


def loads(raw: bytes) -> Any:
    """orjson: several times the standard module's speed; an integer beyond 64 bits is read as a float.

    The bodies parsed here (task documents, to sign their links) hold no such integer.
    """
    return orjson.loads(raw)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, as `loads` reads it."""
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def freeze(resp: GatewayResponse, body: bytes) -> bytes:
    """A stored copy of an answer: a small JSON head, a newline, then the body as it is."""
    head = [resp.status, [h for h in resp.headers if h[0] != "content-length"], time.time()]
    return orjson.dumps(head) + b"\n" + body


def thaw(raw: bytes) -> tuple[GatewayResponse, float]:
    """The stored answer, and when it was stored (unix seconds)."""
    head, _, body = raw.partition(b"\n")
    status, headers, stored_at = orjson.loads(head)
    return GatewayResponse(status, [(k, v) for k, v in headers], body), stored_at
