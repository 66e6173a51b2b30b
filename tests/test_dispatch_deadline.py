"""The route's first-byte deadline (`asyncio.timeout` around the chain, gateway/dispatch.py): the deadline's
expiry answers 504, and nothing else does; a chain's own `TimeoutError` is the chain's failure.

The 504 of a plugin that never returns, on a real gateway process, is in tests/test_hostile_upstream.py."""
from __future__ import annotations

import asyncio

import pytest

from gateway.context import Handler, RequestContext
from gateway.response import GatewayResponse
from gateway.testing import PluginHarness

pytestmark = pytest.mark.inprocess

KEY = "acme-key-0123456789"


async def _answer(upstream: Handler, deadline_sec: float) -> tuple[int, dict[str, object]]:
    async with PluginHarness(["auth"], tenants={"acme": KEY}, upstream=upstream, methods=["GET"]) as gw:
        gw.runtime.deadlines["test"] = deadline_sec
        answer = await gw.request("GET", "/test/a", api_key=KEY)
    return answer.status, answer.json()


async def test_a_chain_past_its_deadline_is_answered_504_deadline() -> None:
    async def stuck(ctx: RequestContext) -> GatewayResponse:
        await asyncio.sleep(60)
        return GatewayResponse(200, body=b"")

    status, body = await asyncio.wait_for(_answer(stuck, 0.2), 10)
    assert status == 504 and body["data"] == {"reason": "deadline"}, body


async def test_a_timeout_error_of_the_chains_own_is_not_the_deadline() -> None:
    async def own_timeout(ctx: RequestContext) -> GatewayResponse:
        raise TimeoutError("a plugin's own wait gave up")

    status, body = await _answer(own_timeout, 30)
    assert status == 500 and body["code"] == 50000, body
