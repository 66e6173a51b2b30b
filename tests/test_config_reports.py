"""What a config change is told: a reload names only the settings that really wait for a restart, and a
plugin's unmet need names the plugin, its route and its line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_TOKEN, gateway_config
from tests.helpers import install_distribution
from tests.procs import ROOT, Service, free_port

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

NEEDS_JSON = '''
from typing import ClassVar

from gateway.plugins.base import PluginBase, Settings


class BodyAudit(PluginBase[Settings]):
    """Reads the parsed body, which the validate plugin provides."""

    name: ClassVar[str] = "body_audit"
    Settings: ClassVar[type[Settings]] = Settings
    needs: ClassVar[frozenset[str]] = frozenset({"json"})

    async def __call__(self, ctx):
        return await self.next(ctx)
'''


def _reload(gateway: Service, config: dict[str, Any]) -> dict[str, Any]:
    gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    answer = httpx.post(f"{gateway.url}/admin/reload", headers=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()["data"]
    return data


def test_adding_an_upstream_or_resizing_a_pool_applies_on_reload_with_no_restart_required(
        services: Callable[..., Service], tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    config = yaml.safe_load(gateway.config_path.read_text())
    config["upstreams"]["reports"] = {"url": f"http://127.0.0.1:{free_port()}", "pool_size": 7}
    config["routes"].append({"name": "reports", "path": "/reports/{rest}", "methods": ["GET"],
                             "upstream": "reports", "rewrite": "/{rest}", "plugins": ["auth"]})
    added = _reload(gateway, config)
    assert added["restart_required"] == [] and added["routes"] == len(config["routes"])
    config["upstreams"]["exports"]["pool_size"] = 13
    assert _reload(gateway, config)["restart_required"] == []
    config["log_level"] = "debug"  # read once at start: the one thing this reload cannot apply
    assert _reload(gateway, config)["restart_required"] == ["log_level"]
    assert gateway.log().count("restart_required") == 1


@pytest.mark.inprocess  # check-config only: no server
def test_a_plugin_needing_json_before_validate_is_named_at_its_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_distribution(site, "body-audit", {"body_audit": "body_audit:BodyAudit"}, NEEDS_JSON)
    text = (ROOT / "config/gateway.yaml").read_text()
    anchor = "      - validate:"
    assert anchor in text
    text = text.replace(anchor, "      - body_audit\n" + anchor, 1)
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    line = text[:text.index("      - body_audit")].count("\n") + 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    result = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "routes[0].plugins[" in result.stderr
    assert (f".body_audit (line {line}): route `submit`: body_audit needs `json`, which validate provides, but "
            "validate is listed after it: list validate before body_audit") in result.stderr, result.stderr
