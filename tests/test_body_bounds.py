"""A body size a config may set is bounded: a setting past the bound is refused at check-config, naming the key,
the bound and why, and the bound itself is accepted."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from exports_common.body_bounds import MAX_BODY_BYTES, MAX_FILTERS_BYTES
from tests.procs import ROOT

pytestmark = pytest.mark.inprocess  # starts no server: `make test-fast` runs it


def check_config(tmp_path: Path, module: str, shipped: str, change: Callable[[dict[str, Any]], None]
                 ) -> subprocess.CompletedProcess[str]:
    config = yaml.safe_load((ROOT / "config" / shipped).read_text())
    change(config)
    path = tmp_path / shipped
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return subprocess.run([sys.executable, "-m", module, "check-config", str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def validate_settings(config: dict[str, Any]) -> dict[str, Any]:
    [submit] = [r for r in config["routes"] if r["name"] == "submit"]
    [settings] = [p["validate"] for p in submit["plugins"] if isinstance(p, dict) and "validate" in p]
    assert isinstance(settings, dict)
    return settings


def gateway_sizes(route_body: int, validate_body: int, filters: int) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        config["routes"][0]["max_body_bytes"] = route_body
        validate_settings(config).update(max_body_bytes=validate_body, max_filters_bytes=filters)
    return change


def backend_sizes(body: int, filters: int) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        config.update(max_body_bytes=body, max_filters_bytes=filters)
    return change


def test_gateway_body_sizes_past_their_bound_are_refused_naming_each(tmp_path: Path) -> None:
    result = check_config(tmp_path, "gateway", "gateway.yaml",
                          gateway_sizes(MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 1, MAX_FILTERS_BYTES + 1))
    assert result.returncode == 2, result.stdout
    problems = [line.strip().removeprefix("- ") for line in result.stderr.splitlines()]
    for key, bound in [("routes[0].max_body_bytes", "67108864 (64 MiB)"),
                       ("routes[0].plugins[2].validate.max_body_bytes", "67108864 (64 MiB)"),
                       ("routes[0].plugins[2].validate.max_filters_bytes", "1048576 (1 MiB)")]:
        assert any(p.startswith(f"{key} (line ") and f"must be at most {bound}: " in p for p in problems), \
            result.stderr


def test_backend_body_sizes_past_their_bound_are_refused_naming_each(tmp_path: Path) -> None:
    result = check_config(tmp_path, "backend_stub", "backend.yaml",
                          backend_sizes(MAX_BODY_BYTES + 1, MAX_FILTERS_BYTES + 1))
    assert result.returncode == 2, result.stdout
    problems = [line.strip().removeprefix("- ") for line in result.stderr.splitlines()]
    for key, bound in [("max_body_bytes", "67108864 (64 MiB)"), ("max_filters_bytes", "1048576 (1 MiB)")]:
        assert any(p.startswith(f"{key} (line ") and f"must be at most {bound}: " in p for p in problems), \
            result.stderr


def answer_sizes(route_answer: int, stored_answer: int) -> Callable[[dict[str, Any]], None]:
    def change(config: dict[str, Any]) -> None:
        config["routes"][0]["max_answer_bytes"] = route_answer
        [idempotency] = [p["idempotency"] for p in config["routes"][0]["plugins"]
                         if isinstance(p, dict) and "idempotency" in p]
        idempotency["max_stored_answer_bytes"] = stored_answer
    return change


def test_answer_sizes_past_their_bound_are_refused_naming_each(tmp_path: Path) -> None:
    result = check_config(tmp_path, "gateway", "gateway.yaml", answer_sizes(MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 1))
    assert result.returncode == 2, result.stdout
    problems = [line.strip().removeprefix("- ") for line in result.stderr.splitlines()]
    for key in ("routes[0].max_answer_bytes", "routes[0].plugins[3].idempotency.max_stored_answer_bytes"):
        assert any(p.startswith(f"{key} (line ") and "must be at most 67108864 (64 MiB): " in p for p in problems), \
            result.stderr


@pytest.mark.parametrize("module,shipped,change", [
    ("gateway", "gateway.yaml", answer_sizes(MAX_BODY_BYTES, MAX_BODY_BYTES)),
    ("gateway", "gateway.yaml", gateway_sizes(MAX_BODY_BYTES, MAX_BODY_BYTES, MAX_FILTERS_BYTES)),
    ("backend_stub", "backend.yaml", backend_sizes(MAX_BODY_BYTES, MAX_FILTERS_BYTES)),
])
def test_the_bounds_themselves_are_accepted(tmp_path: Path, module: str, shipped: str,
                                            change: Callable[[dict[str, Any]], None]) -> None:
    result = check_config(tmp_path, module, shipped, change)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr
