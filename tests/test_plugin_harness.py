"""gateway.testing, the harness for plugin authors, ending in the real proxy to a real upstream."""
from __future__ import annotations

from typing import Callable

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
