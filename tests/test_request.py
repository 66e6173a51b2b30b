"""The gateway's request (gateway/request.py) reads as Starlette's does: the same fields, header values and body."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.datastructures import Headers
from starlette.requests import Request

from gateway.request import GatewayRequest, RequestHeaders

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

RAW = [(b"host", b"gw"), (b"x-dup", b"first"), (b"authorization", b"Bearer k"), (b"x-dup", b"second")]


def scope(raw: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/p", "query_string": b"a=1&a=2", "headers": raw,
            "scheme": "http", "server": ("gw", 80), "root_path": "", "client": ("10.0.0.1", 5000)}


def test_header_lookups_match_starlette() -> None:
    ours, theirs = RequestHeaders(list(RAW)), Headers(raw=list(RAW))
    for name in ("host", "HOST", "X-Dup", "authorization", "x-request-id", "traceparent"):
        assert ours.get(name) == theirs.get(name)
        assert ours.get(name, "-") == theirs.get(name, "-")
        assert (name in ours) == (name in theirs)
    assert ours.getlist("x-dup") == ["first", "second"]
    assert ours.items() == theirs.items() and ours.raw == theirs.raw and ours == theirs


def test_request_has_starlette_fields_and_reads_the_body() -> None:
    chunks = iter([{"type": "http.request", "body": b"ab", "more_body": True},
                   {"type": "http.request", "body": b"c", "more_body": False}])

    async def receive() -> dict[str, Any]:
        return next(chunks)

    starlette = Request(scope(list(RAW)), receive)
    starlette.headers  # noqa: B018 - Starlette makes its headers field on first use
    ours = GatewayRequest(scope(list(RAW)), receive)
    # a Starlette upgrade that adds a field to Request.__init__ fails here, not in a plugin: each is set per
    # request or given on the class
    assert set(vars(starlette)) == set(vars(ours)) | {"_send", "_stream_consumed", "_is_disconnected", "_form"}
    assert all(getattr(ours, name) == getattr(starlette, name) for name in vars(starlette) if name != "_receive")
    assert ours.method == "POST" and ours.url.path == "/p" and ours.client is not None
    assert ours.query_params.getlist("a") == ["1", "2"]
    assert asyncio.run(ours.body()) == b"abc"


def test_a_raw_header_value_is_the_first_as_sent() -> None:
    headers = RequestHeaders(list(RAW))
    assert headers.raw_value(b"x-dup") == b"first" and headers.raw_value(b"authorization") == b"Bearer k"
    assert headers.raw_value(b"traceparent") is None
