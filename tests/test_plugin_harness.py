"""gateway.testing, the harness for plugin authors, ending in the real proxy to a real upstream."""
from __future__ import annotations

import asyncio
import gc
from typing import Callable

from gateway.context import RequestContext
from gateway.response import GatewayResponse
from gateway.testing import PluginHarness
from tests.procs import Service


async def test_a_url_sends_the_chain_through_the_proxy(services: Callable[..., Service]) -> None:
    echo = services("tests.echo_upstream", {}, name="echo")
    async with PluginHarness(["auth"], tenants={"acme": "acme-key-0123456789"}, upstream=echo.url,
                             rewrite="/got/{rest}") as gw:
        answer = await gw.request("POST", "/test/a?x=1", api_key="acme-key-0123456789", json_body={"n": 1})
        refused = await gw.request("POST", "/test/a", api_key="wrong-key")
    assert answer.status == 200, answer.body
    echoed = answer.json()["data"]
    assert (echoed["method"], echoed["path"], echoed["query"], echoed["body_bytes"]) == ("POST", "/got/a", "x=1", 8)
    assert ["x-tenant-id", "acme"] in echoed["headers"]
    assert answer.upstream is None  # the recorder is not the end of this chain
    assert refused.status == 401 and refused.json()["code"] == 40100


async def test_a_handler_as_upstream_sits_inside_the_routes_policy() -> None:
    tries: list[int] = []

    async def flaky(ctx: RequestContext) -> GatewayResponse:
        tries.append(ctx.attempt)
        return GatewayResponse(503 if len(tries) == 1 else 200, body=b"")

    async with PluginHarness(["auth"], policy={"retry": {"attempts": 2, "backoff": {"initial": 0.001, "max": 0.001}}},
                             tenants={"acme": "acme-key-0123456789"}, upstream=flaky, methods=["GET"]) as gw:
        answer = await gw.request("GET", "/test/a", api_key="acme-key-0123456789")
    assert answer.status == 200 and tries == [1, 2]
    assert answer.headers["x-gateway-attempts"] == "2"


async def test_a_request_leaves_no_reference_cycle_behind() -> None:
    """A request's objects go as it ends, by reference counting: one cycle through them (say, a value in its
    context that reaches back to the context) leaves each request's objects to the garbage collector, which then
    runs every few hundred requests over all of them (it cost a cache hit 15% of its rate once)."""
    task_id = "exp-20261130-0123456789abcdefghij"

    async def backend(ctx: RequestContext) -> GatewayResponse:
        return GatewayResponse.envelope({"task_id": task_id, "status": "COMPLETED"})

    plugins = [{"rate_limit": {"limit": "requests"}}, "auth", {"task_id": {"action": "check"}},
               {"status_cache": {"ttl_sec": 60}}]
    async with PluginHarness(plugins, tenants={"acme": "acme-key-0123456789"}, upstream=backend,
                             path="/exports/{task_id}", methods=["GET"]) as gw:

        async def poll() -> None:
            answer = await gw.request("GET", f"/exports/{task_id}", api_key="acme-key-0123456789")
            assert answer.status == 200 and answer.headers["x-cache"] in ("HIT", "MISS")

        for _ in range(3):  # the cache filled, every lazy structure made
            await asyncio.create_task(poll())
        gc.collect()
        gc.disable()
        try:
            for _ in range(50):
                await asyncio.create_task(poll())  # a task (and a context) of its own, as the server gives each
            assert gc.collect() == 0
        finally:
            gc.enable()
