"""Config files: validation with paths, environment interpolation, and the shipped JSON Schemas."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml
from pydantic import BaseModel

from backend_stub.config import BackendConfig
from backend_stub.sources.synthetic import SyntheticSource
from exports_common.config_loader import ConfigError, interpolate, load_model
from gateway.config import GatewayConfig
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.helpers import wait_status
from tests.procs import ROOT, Service

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module,path", [("gateway", "config/gateway.yaml"), ("backend_stub", "config/backend.yaml")])
def test_shipped_configs_are_valid(module: str, path: str) -> None:
    result = run_cli(module, "check-config", path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


@pytest.mark.parametrize("module,model,schema", [
    ("gateway", GatewayConfig, "config/gateway.schema.json"),
    ("backend_stub", BackendConfig, "config/backend.schema.json"),
])
def test_shipped_schema_matches_the_models(module: str, model: type[BaseModel], schema: str) -> None:
    assert json.loads((ROOT / schema).read_text()) == model.model_json_schema(), \
        f"regenerate with: python -m {module} schema > {schema}"


def test_check_config_names_every_problem_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("""
admin_token: short
download_signing: {secrets: ["0123456789abcdef"]}
upstreams:
  exports: {url: "http://127.0.0.1:1"}
routes:
  - name: a
    path: /x/{id}
    methods: [GET]
    upstream: exports
    rewrite: /y/{other}
    plugins:
      - auth
      - retry_forever: {}
      - idempotency: {ttl_sec: 0}
      - task_id: {action: bogus}
""")
    result = run_cli("gateway", "check-config", str(bad))
    assert result.returncode == 2
    out = result.stderr
    for expected in ["admin_token (line 2)", "routes[0].plugins[1].retry_forever (line 14)",
                     "routes[0].plugins[2].idempotency.ttl_sec (line 15)",
                     "routes[0].plugins[3].task_id.action (line 16)", "rewrite uses ['other']"]:
        assert expected in out, out


def test_check_config_on_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    assert run_cli("gateway", "check-config", str(tmp_path / "missing.yaml")).returncode == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text("routes: [unclosed\n")
    result = run_cli("backend_stub", "check-config", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr


def test_env_interpolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_TEST_URL", "redis://h:1/0")
    monkeypatch.delenv("GW_TEST_UNSET", raising=False)
    missing: list[str] = []
    out = interpolate({"a": "${GW_TEST_URL}", "b": ["x-${GW_TEST_UNSET:-dflt}-y"], "c": "${GW_TEST_UNSET:-}",
                       "d": 5, "e": "${GW_TEST_UNSET}"}, "", missing)
    assert out == {"a": "redis://h:1/0", "b": ["x-dflt-y"], "c": "", "d": 5, "e": ""}
    assert missing == ["e: environment variable GW_TEST_UNSET is not set (use ${GW_TEST_UNSET:-default} for a default)"]


def test_env_reaches_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6390/0")
    monkeypatch.setenv("EXPORT_BACKEND_URL", "http://127.0.0.1:9999")
    config = load_model(ROOT / "config/gateway.yaml", GatewayConfig)
    assert config.redis_url == "redis://127.0.0.1:6390/0"
    assert config.upstreams["exports"].url == "http://127.0.0.1:9999"


def test_backend_config_rejects_unknown_columns(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("export_types:\n  x:\n    source: {kind: synthetic, dataset: orders}\n    filters:\n"
                    "      f: {type: string, column: nope}\n")
    with pytest.raises(ConfigError) as err:
        load_model(path, BackendConfig)
    assert "export_types.x" in err.value.problems[0] and "no column 'nope'" in err.value.problems[0]


def test_check_config_names_each_problem_of_an_export_type_by_its_path_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("""export_types:
  a:
    source: {kind: synthetic, dataset: nope}
  b:
    source:
      kind: synthetic
      dataset: orders
      rowz: 5
  c:
    source: {kind: sqlx, url: "postgresql://u:secret@db/x"}
  d:
    source: {dataset: orders}
  e:
    formats: [csv, xml]
    compression: zip
    source: {kind: synthetic, dataset: orders, rows: 0}
  f:
    dataset: orders
    source: {kind: synthetic, dataset: orders}
  g:
    formats: [jsonl, jsonl]
    source: {kind: synthetic, dataset: orders}
""")
    result = run_cli("backend_stub", "check-config", str(bad))
    assert result.returncode == 2
    for expected in [
        "export_types.a.source.dataset (line 3): unknown dataset 'nope'; known: orders, report, tickets, users",
        "export_types.b.source.rowz (line 8): unknown key 'rowz', did you mean 'rows'?",
        "export_types.c.source (line 10): unknown 'kind' 'sqlx'; known: 'synthetic'",
        "export_types.d.source (line 12): 'kind' is missing; one of: 'synthetic'",
        "export_types.e.formats[1] (line 14): unknown format 'xml'; this backend writes csv, jsonl",
        "export_types.e.compression (line 15): Input should be 'gzip'",
        "export_types.e.source.rows (line 16): Input should be greater than or equal to 1",
        "export_types.f (line 18): dataset, rows and seed belong inside source:",
        "export_types.g (line 21): formats lists a format twice",
    ]:
        assert expected in result.stderr, result.stderr
    assert "secret" not in result.stderr  # a problem is named by its path, never with the value of a source


def test_the_old_flat_shape_of_an_export_type_loads_as_a_synthetic_source_with_one_warning(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("export_types:\n  a: {dataset: orders, rows: 10, seed: 3, max_attempts: 2}\n"
                    "  b: {dataset: report}\n  c: {source: {kind: synthetic, dataset: users}}\n")
    config = load_model(path, BackendConfig)
    a, b = config.export_types["a"], config.export_types["b"]
    assert isinstance(a.source, SyntheticSource) and isinstance(b.source, SyntheticSource)
    assert (a.source.dataset, a.source.rows, a.source.seed, a.max_attempts) == ("orders", 10, 3, 2)
    assert b.source.rows == 100_000
    assert config.export_types["b"].formats == ["csv", "jsonl"]  # what every type offered before formats
    assert config.export_types["c"].formats == ["csv"]
    assert config.load_warnings() == [
        "export_types a, b: dataset, rows and seed at the type's top level is the old flat shape; write them as "
        "source: {kind: synthetic, dataset: ..., rows: ..., seed: ...}"]
    result = run_cli("backend_stub", "check-config", str(path))
    assert result.returncode == 0 and result.stderr.count("old flat shape") == 1, result.stderr


def test_an_unknown_key_anywhere_names_the_nearest_known_one(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("workerz: 2\ncallbacks:\n  retry_delay_sec: [1]\n")
    with pytest.raises(ConfigError) as err:
        load_model(path, BackendConfig)
    for expected in ["workerz (line 1): unknown key 'workerz', did you mean 'workers'?",
                     "callbacks.retry_delay_sec (line 3): unknown key 'retry_delay_sec', did you mean "
                     "'retry_delays_sec'?"]:
        assert expected in err.value.problems


def test_check_config_names_the_route_and_the_missing_context_field_and_the_settings_a_reload_would_not_apply(
        tmp_path: Path) -> None:
    running = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    submit = next(r for r in running["routes"] if r["name"] == "submit")
    wrong = dict(running, routes=[dict(submit, plugins=[p for p in submit["plugins"] if p != "auth"])])
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump(wrong))
    result = run_cli("gateway", "check-config", str(path))
    assert result.returncode == 2
    assert "route `submit`: outbox needs `tenant`, which no earlier plugin provides" in result.stderr, result.stderr

    changed = dict(running, redis_prefix="other", upstreams={
        "exports": {"url": "http://127.0.0.1:8081", "pool_size": 10},
        "reports": {"url": "http://127.0.0.1:8089", "pool_size": 7}})
    path.write_text(yaml.safe_dump(changed))
    result = run_cli("gateway", "check-config", str(path), "--running", "config/gateway.yaml")
    assert result.returncode == 0, result.stderr
    assert "warning: redis_prefix changed: it takes effect only at a restart" in result.stderr, result.stderr
    assert "pool_size" not in result.stderr  # pool sizes apply on reload, a new upstream's too


OLDER = ROOT / "tests/data/gateway.older-shape.yaml"  # config/gateway.yaml as shipped before the policy moved


def test_an_older_shape_config_loads_as_the_current_one_with_one_warning_naming_the_new_keys() -> None:
    result = run_cli("gateway", "check-config", str(OLDER))
    assert result.returncode == 0, result.stderr
    [warning] = [line for line in result.stderr.splitlines() if "older shape" in line]
    for key in ("policy.timeout", "policy.retry", "upstreams.exports.circuit_breaker",
                "python -m gateway migrate-config FILE"):
        assert key in warning, warning
    older, current = load_model(OLDER, GatewayConfig), load_model(ROOT / "config/gateway.yaml", GatewayConfig)
    assert older.load_warnings() == [warning.split(": warning: ", 1)[1]] and current.load_warnings() == []
    # the same routes, plugins, policy and breaker; only the shipped download route has a breaker of its own now
    download = next(r for r in current.routes if r.name == "download")
    own = current.breaker_of(download)
    assert own is not None and own.name == "exports@download"
    download.policy.circuit_breaker = None
    assert older.model_dump() == current.model_dump()
    assert [older.breaker_of(r) for r in older.routes] == [current.breaker_of(r) for r in current.routes]


def test_migrate_config_prints_the_current_shape_with_the_comments_kept(tmp_path: Path) -> None:
    result = run_cli("gateway", "migrate-config", str(OLDER))
    assert result.returncode == 0, result.stderr
    migrated = tmp_path / "migrated.yaml"
    migrated.write_text(result.stdout)
    config = load_model(migrated, GatewayConfig)
    assert config.load_warnings() == [] and config.model_dump() == load_model(OLDER, GatewayConfig).model_dump()
    assert "# backend down: store, answer 202 degraded, deliver later" in result.stdout  # comments kept
    assert "${EXPORT_BACKEND_URL:-http://127.0.0.1:8081}" in result.stdout  # the environment read at load, as before
    assert "retry: *retry" in result.stdout and "- timeout" not in result.stdout
    current = run_cli("gateway", "migrate-config", "config/gateway.yaml")
    assert current.returncode == 0 and current.stdout == (ROOT / "config/gateway.yaml").read_text()
    assert "already in the current shape" in current.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(OLDER.read_text().replace("upstream: exports", "upstream: nowhere", 1))
    refused = run_cli("gateway", "migrate-config", str(broken))
    assert refused.returncode == 2 and refused.stdout == "" and "routes[0].upstream (line " in refused.stderr


def test_a_gateway_on_an_older_shape_config_warns_once_and_serves_it_in_the_current_shape(
        services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, base=yaml.safe_load(OLDER.read_text())))
    auth = {"Authorization": f"Bearer {DEMO_KEY}"}
    task = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": "report_export"}, headers=auth)
    assert task.status_code == 202 and task.headers["x-gateway-attempts"] == "1"  # through the policy's retry
    done = wait_status(gateway.url, task.json()["data"]["task_id"], path="/api/v1/exports/", headers=auth)
    assert done["status"] == "COMPLETED"
    routes = httpx.get(f"{gateway.url}/admin/routes", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    shown = {r["name"]: r for r in routes["data"]["routes"]}
    assert routes["data"]["upstreams"]["exports"]["circuit_breaker"]["fail_max"] == 5
    assert shown["status"]["policy"]["timeout"] == {"connect": 1, "read": 5, "total": 8}
    assert shown["download"]["policy"]["circuit_breaker"]["name"] == "exports"  # as it was: the upstream's
    assert not [p for r in shown.values() for p in r["plugins"] if set(p) & {"timeout", "retry", "circuit_breaker"}]
    [warning] = [json.loads(line) for line in gateway.log().splitlines() if "older shape" in line]
    assert warning["level"] == "warning" and "upstreams.exports.circuit_breaker" in warning["msg"]


def older_routes(tmp_path: Path, change: Callable[[list[dict[str, Any]]], None]) -> Path:
    config = yaml.safe_load(OLDER.read_text())
    change(config["routes"])
    path = tmp_path / "older.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_older_shape_breakers_that_differ_between_routes_are_refused_naming_both(tmp_path: Path) -> None:
    def status_differs(routes: list[dict[str, Any]]) -> None:
        routes[3]["plugins"] = [{"circuit_breaker": {"fail_max": 9}} if isinstance(p, dict) and "circuit_breaker" in p
                                else p for p in routes[3]["plugins"]]

    with pytest.raises(ConfigError) as refused:
        load_model(older_routes(tmp_path, status_differs), GatewayConfig)
    [problem] = refused.value.problems
    assert problem.startswith("routes[3].plugins[9].circuit_breaker (line ")
    assert "routes 'submit' and 'status' configure circuit_breaker of upstream 'exports' differently" in problem
    assert "upstreams.exports.circuit_breaker" in problem and "scope: route" in problem


def test_an_older_shape_route_that_did_not_list_the_breaker_keeps_out_of_it(tmp_path: Path) -> None:
    def cancel_without(routes: list[dict[str, Any]]) -> None:
        routes[4]["plugins"] = [p for p in routes[4]["plugins"] if not (isinstance(p, dict) and "circuit_breaker" in p)]

    config = load_model(older_routes(tmp_path, cancel_without), GatewayConfig)
    breakers = {r.name: config.breaker_of(r) for r in config.routes}
    assert breakers["cancel"] is None and breakers["submit"] is not None and breakers["submit"].name == "exports"
    assert "routes cancel, which did not list it, keep out" in config.load_warnings()[0]


def refused_with_lines(tmp_path: Path, text: str) -> tuple[list[str], Callable[..., int]]:
    """The problems load_model finds in `text`, and a finder of the line holding a snippet (after a line)."""
    lines = text.splitlines()

    def line(snippet: str, after: int = 0) -> int:
        return next(n for n, ln in enumerate(lines, 1) if n > after and snippet in ln)

    path = tmp_path / "wrong.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_model(path, GatewayConfig)
    return refused.value.problems, line


def test_cross_field_problems_point_at_the_route_not_at_the_top_of_the_file(tmp_path: Path) -> None:
    text = (ROOT / "config/gateway.yaml").read_text()
    text = text.replace("  - name: list\n", "  - name: submit\n", 1)  # a second route named submit
    text = text.replace("    upstream: exports\n    rewrite: /export-types\n",
                        "    upstream: reports\n    rewrite: /export-types\n", 1)
    problems, line = refused_with_lines(tmp_path, text)
    assert problems == [
        f"routes[1].name (line {line('- name: submit', line('- name: submit'))}): route name 'submit' is taken by "
        "routes[0]; each route needs a name of its own",
        f"routes[2].upstream (line {line('upstream: reports')}): route 'export_types' names upstream 'reports', "
        "which is not among ['exports']"]


def test_a_plugin_listed_before_the_one_it_needs_is_named_with_it_at_its_line(tmp_path: Path) -> None:
    text = (ROOT / "config/gateway.yaml").read_text().replace(
        "      - rate_limit: {limit: requests}\n      - auth\n    policy:\n      timeout: {connect: 2, read: 5",
        "      - rate_limit: {limit: requests}\n      - stale_if_error\n      - auth\n    policy:\n"
        "      timeout: {connect: 2, read: 5", 1)
    problems, line = refused_with_lines(tmp_path, text)
    assert problems == [
        f"routes[2].plugins[1].stale_if_error (line {line('- stale_if_error')}): route `export_types`: stale_if_error "
        "needs `tenant`, which auth provides, but auth is listed after it: list auth before stale_if_error"]
