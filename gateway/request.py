"""The request a route's plugins see: Starlette's `Request`, made and read at a cache hit's pace.

It is a `Request` (a plugin may use any of its interface: `.url`, `.query_params`,
`.stream()`, ...); what differs is the cost of what every request does: Starlette's
`Headers.get` finds a missing header by raising and catching a KeyError, and every
request asks for one it seldom carries (`x-request-id`); its `Request` is made through
two constructors, an assertion and a lazy `headers` that probes for itself with
`hasattr`. Only HTTP scopes are ever made into one, and every request reads its headers.
"""
from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request, empty_send
from starlette.types import Receive, Scope


class RequestHeaders(Headers):
    """Starlette's `Headers` of a request; `get` finds a missing name without raising and catching a KeyError."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._list = raw  # what Headers(raw=raw) keeps, without its argument checks

    def raw_value(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower case) as sent: no name to encode, no value to decode."""
        for candidate, value in self._list:
            if candidate == name:
                return value
        return None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw_value(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")


class GatewayRequest(Request):
    # the fields Request.__init__ sets to the same value for every request, read from the class until one changes
    _send = staticmethod(empty_send)
    _stream_consumed = False
    _is_disconnected = False
    _form = None

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self._receive = receive
        self._headers: RequestHeaders = RequestHeaders(scope["headers"])

    @property
    def headers(self) -> RequestHeaders:
        return self._headers
