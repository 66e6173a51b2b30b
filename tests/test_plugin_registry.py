"""Third-party plugins found through entry points: what check-config says when one is broken or clashes.

Each case is a real installed distribution (a `.dist-info` with an `entry_points.txt` on the
gateway's path), found by importlib.metadata as pip-installed packages are, and checked by a
real `python -m gateway check-config` process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from exports_common.config_loader import ConfigError, load_model
from gateway.config import GatewayConfig
from gateway.plugin_registry import GROUP
from tests.helpers import install_distribution
from tests.procs import ROOT

# package name -> (its entry points, its module's source)
PACKAGES = {
    "broken-plugin": ({"broken": "broken_plugin:Broken"}, "import no_such_module_anywhere\n"),
    "sneaky-auth": ({"auth": "sneaky_auth:Auth"}, "class Auth: ...\n"),
    "not-a-class": ({"not_a_class": "not_a_class:make"}, "def make(): ...\n"),
    "misnamed": ({"misnamed": "misnamed:Plugin"},
                 "from gateway.plugins.auth import Auth\nclass Plugin(Auth):\n    name = 'other'\n"),
    "lax": ({"lax": "lax:Lax"}, "from pydantic import BaseModel\nfrom gateway.plugins.auth import Auth\n"
                                "class Lax(Auth):\n    name = 'lax'\n    Settings = BaseModel\n"),
    "plain": ({"plain": "plain:Plain"}, "class Plain:\n    name = 'plain'\n"),
    "dup-one": ({"dup": "dup_one:Dup"}, "class Dup: ...\n"),
    "dup-two": ({"dup": "dup_two:Dup"}, "class Dup: ...\n"),
}


def install_fake_packages(site: Path) -> None:
    for package, (eps, source) in PACKAGES.items():
        install_distribution(site, package, eps, source)


def config_naming(tmp_path: Path, plugins: list[str]) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "admin_token": "an-admin-token", "download_signing": {"secrets": ["0123456789abcdef"]},
        "upstreams": {"up": {"url": "http://127.0.0.1:1"}},
        "routes": [{"name": "beta", "path": "/beta", "methods": ["GET"], "upstream": "up", "plugins": plugins}],
    }))
    return path


def check_config(tmp_path: Path, site: Path, plugins: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "gateway", "check-config", str(config_naming(tmp_path, plugins))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_broken_and_clashing_packages_are_config_errors_naming_package_and_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_fake_packages(site)
    result = check_config(tmp_path, site, ["auth", "broken", "not_a_class", "plain", "misnamed", "lax", "dup"])
    assert result.returncode == 2, result.stdout
    problems = result.stderr
    assert "Traceback" not in problems
    expected = [
        "routes[0].plugins[0].auth (line",
        "route `beta`: plugin 'auth' is built in, and entry point 'auth = sneaky_auth:Auth' (group "
        "export_gateway.plugins) of package 'sneaky-auth 1.0' declares it too",
        "route `beta`: plugin 'broken' cannot be imported: entry point 'broken = broken_plugin:Broken' (group "
        "export_gateway.plugins) of package 'broken-plugin 1.0' fails with ModuleNotFoundError: "
        "No module named 'no_such_module_anywhere'",
        "plugin 'not_a_class' is not a gateway plugin: entry point 'not_a_class = not_a_class:make'",
        "it names function",
        "of package 'plain 1.0': class Plain does not subclass gateway.plugins.base.PluginBase",
        "of package 'misnamed 1.0': class Plugin says its name is 'other'; make it 'misnamed'",
        "of package 'lax 1.0': Lax.Settings must forbid unknown keys",
        "plugin 'dup' is declared by more than one package",
        "'dup-one 1.0'", "'dup-two 1.0'",
    ]
    for part in expected:
        assert part in problems, problems


def test_the_plugins_command_lists_each_name_with_its_origin(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_fake_packages(site)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    result = subprocess.run([sys.executable, "-m", "gateway", "plugins"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["fault"] == "built in" and "retry" not in lines  # the route's policy, not a plugin
    assert lines["tenant_allowlist"].startswith("entry point 'tenant_allowlist = tenant_allowlist:TenantAllowlist' "
                                                "(group export_gateway.plugins) of package "
                                                "'export-gateway-tenant-allowlist 0.1.0'")
    assert lines["auth"].startswith("UNUSABLE: plugin 'auth' is built in, and entry point")
    assert lines["broken"].startswith("UNUSABLE: plugin 'broken' cannot be imported")


def test_a_broken_package_no_route_names_costs_nothing(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_fake_packages(site)
    result = check_config(tmp_path, site, ["fault"])
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr


def test_unknown_plugin_and_settings_keys_suggest_the_nearest_name(tmp_path: Path) -> None:
    path = config_naming(tmp_path, ["auth"])
    config = yaml.safe_load(path.read_text())
    # retry as a plugin: the older shape, whose problems are still named at their place in the file
    config["routes"][0]["plugins"] = ["status_cach", {"idempotency": {"ttl_secs": 5}},
                                      {"retry": {"backoff": {"intial": 0.1}}}, "zzzqqq"]
    config["upstreams"]["up"]["timeout"] = {"read": 5}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as refused:
        load_model(path, GatewayConfig)
    problems = refused.value.problems
    assert any(p.startswith("routes[0].plugins[0].status_cach (line ") and p.endswith(
        ": route `beta`: unknown plugin 'status_cach', did you mean 'status_cache'?") for p in problems), problems
    assert any(p.startswith("routes[0].plugins[1].idempotency.ttl_secs (line ") and p.endswith(
        ": route `beta`, plugin idempotency: unknown key 'ttl_secs', did you mean 'ttl_sec'?") for p in problems)
    assert any("routes[0].plugins[2].retry.backoff.intial" in p and "did you mean 'initial'?" in p
               for p in problems), problems
    assert any("unknown plugin 'zzzqqq'; known plugins: auth, " in p and GROUP in p for p in problems), problems
    assert any(p.startswith("upstreams.up.timeout") and "did you mean 'timeouts'?" in p for p in problems), problems


def test_the_json_schema_knows_the_built_ins_and_leaves_room_for_installed_plugins() -> None:
    schema = json.loads((ROOT / "config/gateway.schema.json").read_text())
    routes = {"$defs": schema["$defs"], "type": "array", "items": {"$ref": "#/$defs/RouteConfig"}}
    shipped = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())["routes"]
    shipped[0]["plugins"] += [{"tenant_allowlist": {"tenants": ["demo"]}}, {"auth": None}]
    jsonschema.validate(shipped, routes)
    shipped[0]["plugins"].append({"auth": {"requird": True}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(shipped, routes)


def test_a_config_dumps_its_plugin_entries_as_yaml_writes_them() -> None:
    config = load_model(ROOT / "config/gateway.yaml", GatewayConfig)
    dumped = config.model_dump(mode="json")
    assert all(len(entry) == 1 for route in dumped["routes"] for entry in route["plugins"])
    assert GatewayConfig.model_validate(dumped) == config
