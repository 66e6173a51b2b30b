"""tenant_allowlist in-process, on the harness the gateway exports for plugin authors (gateway.testing)."""
from __future__ import annotations

import pytest

from exports_common.config_loader import ConfigError
from gateway.testing import PluginHarness

KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}
ROUTE = [{"auth": {"required": False}}, {"tenant_allowlist": {"tenants": ["acme"]}}]


async def test_a_listed_tenant_reaches_the_upstream() -> None:
    async with PluginHarness(ROUTE, tenants=KEYS) as gw:
        answer = await gw.request("GET", "/test/report", api_key=KEYS["acme"])
    assert answer.status == 200
    assert answer.upstream is not None and answer.upstream.tenant == "acme"


async def test_another_tenant_gets_the_no_route_answer_and_nothing_goes_upstream() -> None:
    async with PluginHarness(ROUTE, tenants=KEYS) as gw:
        refused = await gw.request("GET", "/test/report", api_key=KEYS["globex"])
        unrouted = await gw.request("GET", "/elsewhere", api_key=KEYS["globex"])
    assert refused.upstream is None
    assert (refused.status, refused.json()) == (unrouted.status, {**unrouted.json(), "message":
                                                                  "no route for /test/report"})
    assert refused.json()["code"] == 40400


async def test_a_request_without_a_key_is_asked_for_one() -> None:
    async with PluginHarness(ROUTE, tenants=KEYS) as gw:
        anonymous = await gw.request("GET", "/test/report")
    assert anonymous.status == 401 and anonymous.upstream is None
    assert anonymous.headers["www-authenticate"].startswith("Bearer")


def test_an_empty_list_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as refused:
        PluginHarness(["auth", {"tenant_allowlist": {"tenants": []}}])
    assert "route `test`, plugin tenant_allowlist: List should have at least 1 item" in refused.value.problems[0]


def test_a_route_without_auth_before_it_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as refused:
        PluginHarness([{"tenant_allowlist": {"tenants": ["acme"]}}, "auth"])
    assert refused.value.problems == [
        "routes[0].plugins[0].tenant_allowlist: route `test`: tenant_allowlist needs `tenant`, which auth provides, "
        "but auth is listed after it: list auth before tenant_allowlist"]
