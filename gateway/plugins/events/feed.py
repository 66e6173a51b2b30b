"""Reading an upstream's change feed: newline-delimited JSON over one long HTTP answer.

The lines are the backend's (`backend_stub/change_feed.py`, and the upstream contract in
docs/backend-teams/backend-api.md): `{"position": ID}`, `{"id": ID, "task_id", "tenant",
"task"}`, `{"gap": AFTER, "position": ID}`. A line longer than MAX_LINE_BYTES, or one
that is not a JSON object, ends the read: the feed cannot be trusted from there on.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import orjson

from gateway.response import GatewayResponse
from gateway.services import Services, Upstream
from gateway.upstream import FeedSettings, Timeouts, UpstreamError

MAX_LINE_BYTES = 4 * 1024 * 1024
NO_FEED = frozenset({404, 405, 501})


class NoFeed(Exception):
    """The upstream serves no change feed (404, 405 or 501): its watched tasks are polled instead."""


def query(after: str | None, tenant: str | None = None, follow: bool = True) -> str:
    """The feed's query string: from `after` (none: the feed's current end), for `tenant` (none: every tenant)."""
    params = {"after": after or None, "tenant": tenant, "follow": None if follow else "false"}
    return urlencode({name: value for name, value in params.items() if value is not None})


async def lines(resp: GatewayResponse) -> AsyncIterator[dict[str, Any]]:
    """The answer's lines as JSON objects, read as they arrive; the connection is released at the end."""
    if resp.status in NO_FEED:
        resp.close()
        raise NoFeed
    if resp.status != 200 or resp.stream is None:
        await resp.read()
        raise UpstreamError("reset", f"the change feed answered {resp.status}")
    rest = b""
    try:
        async for chunk in resp.stream:
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            if len(rest) > MAX_LINE_BYTES:
                raise UpstreamError("reset", f"a change feed line passed {MAX_LINE_BYTES} bytes")
            for part in parts:
                if part.strip():
                    line = orjson.loads(part)
                    if not isinstance(line, dict):
                        raise UpstreamError("reset", "a change feed line is not a JSON object")
                    yield line
    except orjson.JSONDecodeError as exc:
        raise UpstreamError("reset", f"a change feed line is not JSON: {exc}") from exc
    finally:
        resp.close()


async def follow(services: Services, upstream: Upstream, feed: FeedSettings,
                 after: str | None) -> AsyncIterator[dict[str, Any]]:
    """The feed from `after` (None: from its current end), on one endpoint of the upstream, for as long as it
    lasts; a read that waits longer than `feed.silence_sec` is a dead feed (UpstreamError)."""
    endpoint = upstream.pool.pick()
    q = query(after)
    url = f"{endpoint.url}{feed.path}" + (f"?{q}" if q else "")
    timeouts = Timeouts(connect=upstream.timeouts.connect, read=feed.silence_sec)
    try:
        resp = await services.client.request("GET", url, [("accept", "application/x-ndjson"), *upstream.auth], None,
                                              timeouts)
    except UpstreamError as exc:
        if exc.kind == "connect_error":
            upstream.pool.connect_failed(endpoint)
        raise
    upstream.pool.connected(endpoint)
    async for line in lines(resp):
        yield line
    raise UpstreamError("reset", "the change feed ended")
