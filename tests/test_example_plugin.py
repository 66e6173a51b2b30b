"""The example third-party plugin (examples/tenant_allowlist), installed as its own package, in a real gateway.

`make install` installs it beside the gateway (pip install -e examples/tenant_allowlist); the
gateway finds it through its entry point, as it would any plugin a backend team ships.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

import httpx
import pytest
import yaml

from exports_common.config_loader import ConfigError, load_model
from gateway.config import GatewayConfig
from tests.conftest import ADMIN_TOKEN, DEMO2_KEY, DEMO_KEY, gateway_config
from tests.helpers import install_distribution, upstream_calls
from tests.procs import ROOT, Service

BETA = {"name": "beta", "path": "/beta/{rest}", "methods": ["GET"], "upstream": "echo", "rewrite": "/got/{rest}",
        "plugins": [{"auth": {"required": False}}, {"tenant_allowlist": {"tenants": ["demo"]}}]}


@pytest.fixture(autouse=True)
def _installed() -> None:
    try:
        version("export-gateway-tenant-allowlist")
    except PackageNotFoundError:
        pytest.fail("the example plugin is not installed: make install installs it "
                    "(pip install -e examples/tenant_allowlist)")


def test_a_route_open_to_listed_tenants_only(services: Callable[..., Service], tmp_path: Path) -> None:
    echo = services("tests.echo_upstream", {}, name="echo")
    config = gateway_config(tmp_path, echo.url)
    config["upstreams"]["echo"] = {"url": echo.url}
    config["routes"] = [BETA]
    # beside it, an installed package whose plugin cannot be imported, which no route names: never imported
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "broken-was-imported"
    install_distribution(site, "broken-plugin", {"broken": "broken_plugin:Broken"},
                         f"open({str(marker)!r}, 'w').close()\nimport no_such_module\n")
    gateway = services("gateway", config, name="gateway", PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    note = next(json.loads(line) for line in gateway.log().splitlines() if "no route names are not loaded" in line)
    assert note["plugins"] == ["broken"] and not marker.exists()
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        allowed = client.get("/beta/report", headers={"Authorization": f"Bearer {DEMO_KEY}"})
        assert allowed.status_code == 200, allowed.text
        echoed = allowed.json()["data"]
        assert echoed["path"] == "/got/report" and ["x-tenant-id", "demo"] in echoed["headers"]

        other = client.get("/beta/report", headers={"Authorization": f"Bearer {DEMO2_KEY}"})
        no_route = client.get("/no/such/route", headers={"Authorization": f"Bearer {DEMO2_KEY}"})
        # another tenant cannot tell the route from one that does not exist
        assert other.status_code == no_route.status_code == 404
        assert other.json()["code"] == no_route.json()["code"] == 40400
        assert other.json()["message"] == "no route for /beta/report"

        anonymous = client.get("/beta/report")
        assert anonymous.status_code == 401 and anonymous.json()["code"] == 40100
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert upstream_calls(gateway.url, "beta") == 1  # only the allowed request went upstream


def test_its_settings_are_checked_like_a_built_in(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "http://127.0.0.1:1")
    config["upstreams"]["echo"] = {"url": "http://127.0.0.1:1"}
    config["routes"] = [{**BETA, "plugins": ["auth", {"tenant_allowlist": {"tenant": ["demo"]}},
                                             {"tenant_allowlist": {"tenants": []}}]}]
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(ConfigError) as refused:
        load_model(path, GatewayConfig)
    problems = refused.value.problems
    assert any(p.startswith("routes[0].plugins[1].tenant_allowlist.tenant (line ") and p.endswith(
        "route `beta`, plugin tenant_allowlist: unknown key 'tenant', did you mean 'tenants'?") for p in problems)
    assert any(p.startswith("routes[0].plugins[2].tenant_allowlist.tenants (line ") and
               "List should have at least 1 item" in p for p in problems), problems


def test_its_tests_pass_from_a_copy_outside_the_repository(tmp_path: Path) -> None:
    """A plugin author's checkout has only the package: its pyproject.toml alone makes pytest run the async tests."""
    copy = tmp_path / "tenant_allowlist"
    shutil.copytree(ROOT / "examples/tenant_allowlist", copy,
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", ".pytest_cache"))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
                            cwd=copy, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout and "skipped" not in result.stdout and "warning" not in result.stdout


HOOKS_FAIL = """
from typing import ClassVar

from gateway.plugins.base import PluginBase, Settings


class Flaky(PluginBase[Settings]):
    name: ClassVar[str] = "flaky_hooks"
    Settings: ClassVar[type[Settings]] = Settings

    async def __call__(self, ctx):
        return await self.next(ctx)

    @classmethod
    def observe(cls, services):
        services.metrics.observe_gauge("flaky_hooks_gauge", "a gauge whose read fails", lambda: [1 / 0])

    @classmethod
    async def before_scrape(cls, services):
        raise RuntimeError("before_scrape broke")

    @classmethod
    async def stats(cls, services):
        raise RuntimeError("stats broke")

    @classmethod
    def background(cls, current):
        async def work():
            raise RuntimeError("background broke")
        return [work()]
"""


def test_a_plugin_whose_hooks_raise_is_skipped_and_logged_once(services: Callable[..., Service],
                                                               tmp_path: Path) -> None:
    echo = services("tests.echo_upstream", {}, name="echo")
    config = gateway_config(tmp_path, echo.url, metrics_auth="admin_token")
    config["upstreams"]["echo"] = {"url": echo.url}
    config["routes"] = [*config["routes"], {**BETA, "plugins": [{"auth": {"required": False}}, "flaky_hooks"]}]
    site = tmp_path / "site"
    site.mkdir()
    install_distribution(site, "flaky-plugin", {"flaky_hooks": "flaky_plugin:Flaky"}, HOOKS_FAIL)
    gateway = services("gateway", config, name="gateway", PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=gateway.url, headers=admin, timeout=10) as client:
        for _ in range(3):
            metrics = client.get("/metrics")
            assert metrics.status_code == 200 and "gateway_config_info" in metrics.text
            assert "flaky_hooks_gauge" not in metrics.text and "gateway_event_streams_open" in metrics.text
            stats = client.get("/admin/stats")
            assert stats.status_code == 200 and "pid" in stats.json()["data"] and "outbox" in stats.json()["data"]
        assert client.get("/beta/x", headers={"Authorization": f"Bearer {DEMO_KEY}"}).status_code == 200
    lines = [json.loads(line) for line in gateway.log().splitlines() if line.startswith("{")]
    failures = sorted(line.get("hook") or line.get("gauge") for line in lines if line["level"] == "error")
    assert failures == ["background", "before_scrape", "flaky_hooks_gauge", "stats"], failures
