"""Config files: validation with paths, environment interpolation, and the shipped JSON Schemas."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from backend_stub.config import BackendConfig
from exports_common.config_loader import ConfigError, interpolate, load_model
from gateway.config import GatewayConfig
from tests.procs import ROOT

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
    a = config.export_types["a"]
    assert (a.source.kind, a.source.dataset, a.source.rows, a.source.seed, a.max_attempts) == (
        "synthetic", "orders", 10, 3, 2)
    assert config.export_types["b"].source.rows == 100_000
    assert config.export_types["b"].formats == ["csv", "jsonl"]  # what every type offered before formats
    assert config.export_types["c"].formats == ["csv"]
    assert config.config_warnings() == [
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
    import yaml

    running = yaml.safe_load((ROOT / "config/gateway.yaml").read_text())
    submit = next(r for r in running["routes"] if r["name"] == "submit")
    wrong = dict(running, routes=[dict(submit, plugins=[p for p in submit["plugins"] if p != "auth"])])
    path = tmp_path / "wrong.yaml"
    path.write_text(yaml.safe_dump(wrong))
    result = run_cli("gateway", "check-config", str(path))
    assert result.returncode == 2
    assert "route `submit`: outbox needs `tenant`, which no earlier plugin provides" in result.stderr, result.stderr

    changed = dict(running, redis_prefix="other", upstreams={"exports": {"url": "http://127.0.0.1:8081",
                                                                        "pool_size": 10}})
    path.write_text(yaml.safe_dump(changed))
    result = run_cli("gateway", "check-config", str(path), "--running", "config/gateway.yaml")
    assert result.returncode == 0, result.stderr
    for setting in ("redis_prefix", "upstreams.exports.pool_size"):
        assert f"warning: {setting} changed: it takes effect only at a restart" in result.stderr, result.stderr
