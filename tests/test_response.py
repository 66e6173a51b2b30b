"""A prepared answer (its headers encoded once, gateway/response.py) sends what an unprepared one would."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.response import GatewayResponse

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it


def sent(resp: GatewayResponse) -> list[tuple[bytes, bytes]]:
    messages: list[Any] = []

    async def send(message: Any) -> None:
        messages.append(message)

    async def receive() -> Any:
        return {"type": "http.request"}

    asyncio.run(resp({"type": "http", "method": "GET"}, receive, send))
    return sorted(messages[0]["headers"])


def test_a_prepared_copy_sends_its_changes() -> None:
    cached = GatewayResponse(200, [("content-type", "application/json"), ("x-cache", "HIT")], b'{"a":1}').prepare()
    plain = GatewayResponse(200, list(cached.headers), cached.body)
    changes = [
        lambda r: r.set_header("x-request-id", "r1"),  # added after the prepared headers
        lambda r: r.set_header("x-cache", "STALE"),  # a prepared header replaced
        lambda r: r.replace_json({"b": 22}),  # a new body, so a new length
        lambda r: r.headers.insert(0, ("x-first", "1")),  # the list changed in place
    ]
    for change in changes:
        ours, theirs = cached.copy(), plain.copy()
        change(ours)
        change(theirs)
        assert sent(ours) == sent(theirs)
    assert sent(cached.copy()) == sorted([(b"content-type", b"application/json"), (b"x-cache", b"HIT"),
                                          (b"content-length", b"7")])
