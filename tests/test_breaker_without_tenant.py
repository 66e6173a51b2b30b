"""A route with no tenant provider (no `auth`) whose upstream answers 5xx, through a real gateway.

Its breaker never reads `tenant` (gateway/policy/circuit_breaker.py): on a breaker of its own
there is no tenant to isolate, so its 5xx open that breaker as transport failures would (503
`circuit_open`, no further upstream call); on its upstream's shared breaker its callers are one
anonymous tenant, whose 5xx alone never open the breaker the tenants' routes go through.
"""
from __future__ import annotations

from typing import Any, Callable

import httpx
import pytest

from exports_common.config_loader import load_model
from gateway.config import GatewayConfig
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, gateway_config
from tests.helpers import assert_envelope_error
from tests.procs import ROOT, Service

FAIL_MAX = 3
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def route(name: str, plugins: list[Any], scope: str = "upstream") -> dict[str, Any]:
    return {"name": name, "path": f"/{name}/{{code}}", "methods": ["GET"], "upstream": "flaky",
            "rewrite": "/status/{code}/x", "plugins": plugins, "policy": {"circuit_breaker": {"scope": scope}}}


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Service, Service]:
    upstream = module_services("tests.status_upstream", {}, name="flaky")
    config = gateway_config(tmp_path_factory.mktemp("breaker"), upstream.url)
    config["upstreams"]["flaky"] = {"url": upstream.url,
                                    "circuit_breaker": {"fail_max": FAIL_MAX, "reset_timeout_sec": 60}}
    config["routes"] = [route("own", [], "route"), route("own_unavailable", [], "route"),
                        route("anonymous", []), route("api", ["auth"])]
    return upstream, module_services("gateway", config, name="gateway")


def upstream_calls(upstream: Service) -> int:
    return int(httpx.get(f"{upstream.url}/calls", timeout=10).json()["data"]["calls"])


def breakers(gateway: Service) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{gateway.url}/admin/breakers", headers=ADMIN, timeout=10).json()["data"]
    return data


@pytest.mark.parametrize("name, status", [("own", 500), ("own_unavailable", 503)])
def test_on_a_breaker_of_its_own_a_tenantless_routes_5xx_open_it(stack: tuple[Service, Service], name: str,
                                                                  status: int) -> None:
    upstream, gateway = stack
    before = upstream_calls(upstream)
    for _ in range(FAIL_MAX):
        assert httpx.get(f"{gateway.url}/{name}/{status}", timeout=10).status_code == status
    refused = httpx.get(f"{gateway.url}/{name}/{status}", timeout=10)
    body = assert_envelope_error(refused, 503, refused.json()["code"])
    assert body["data"]["reason"] == "circuit_open" and int(refused.headers["retry-after"]) >= 1
    assert upstream_calls(upstream) == before + FAIL_MAX, "an open breaker makes no upstream call"
    own = breakers(gateway)[f"flaky@{name}"]
    assert own["state"] == "open" and own["tenants"] == {}, own  # no anonymous tenant's breaker: nobody to isolate
    assert breakers(gateway)["flaky"]["state"] == "closed", "the upstream's shared breaker is another"


def test_on_the_shared_breaker_a_tenantless_routes_5xx_never_open_it_for_the_tenants(
        stack: tuple[Service, Service]) -> None:
    upstream, gateway = stack
    before = upstream_calls(upstream)
    for _ in range(FAIL_MAX):
        assert httpx.get(f"{gateway.url}/anonymous/500", timeout=10).status_code == 500
    refused = httpx.get(f"{gateway.url}/anonymous/500", timeout=10)
    assert assert_envelope_error(refused, 503, refused.json()["code"])["data"]["reason"] == "tenant_circuit_open"
    shared = breakers(gateway)["flaky"]
    assert shared["state"] == "closed" and shared["tenants"]["-"]["state"] == "open", shared
    served = httpx.get(f"{gateway.url}/api/200", headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=10)
    assert served.status_code == 200, served.text
    assert upstream_calls(upstream) == before + FAIL_MAX + 1


@pytest.mark.inprocess
def test_every_shipped_route_with_a_breaker_counts_5xx_per_tenant() -> None:
    """The shipped routes each have `auth` (the download route's optional: a signed link's caller is the
    anonymous tenant), so the rule for routes without a tenant provider changes none of them."""
    config = load_model(ROOT / "config/gateway.yaml", GatewayConfig)
    uses = [config.breaker_of(r) for r in config.routes]
    assert {use.status_owner for use in uses if use is not None} == {"tenant"}
    assert "exports@download" in {use.name for use in uses if use is not None}
