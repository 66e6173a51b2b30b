"""The backend reloads backend.yaml while it runs; a file caught half-written never takes export types away."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

from tests.conftest import backend_config
from tests.helpers import assert_envelope_error, backend_create
from tests.procs import Service, backend_headers, wait_until
from tests.test_observability import metric, scrape


def _types_last(config: dict[str, Any]) -> str:
    """The config as YAML with its export types written last."""
    return yaml.safe_dump({k: v for k, v in config.items() if k != "export_types"}
                          | {"export_types": config["export_types"]}, sort_keys=False)


def _types(backend: Service) -> list[str]:
    items = httpx.get(f"{backend.url}/export-types", headers=backend_headers(), timeout=10).json()["data"]["items"]
    return [t["export_type"] for t in items]


def _reloads(backend: Service, outcome: str) -> float:
    return metric(scrape(backend), "backend_config_reloads_total", outcome=outcome) or 0.0


def test_a_half_written_file_is_refused_and_an_operator_applies_removals_on_purpose(
        services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    names = _types(backend)
    assert len(names) >= 4 and _reloads(backend, "refused_removals") == 0
    whole = _types_last(backend.config)
    cut = whole.index(f"\n  {names[2]}:\n") + 1
    with backend.config_path.open("w") as out:  # written in place, and read mid-write
        out.write(whole[:cut])
        out.flush()
        wait_until(lambda: _reloads(backend, "refused_removals") >= 1, 10, interval=0.05,
                   what="the watcher to refuse the truncated file")
        assert _types(backend) == names, "every export type is still offered"
        before = _reloads(backend, "refused_removals")
        backend.signal(signal.SIGHUP)
        wait_until(lambda: _reloads(backend, "refused_removals") > before, 10, interval=0.05,
                   what="SIGHUP to refuse it too")
        assert_envelope_error(httpx.post(f"{backend.url}/internal/reload?allow_removals=true"), 401, 40100)
        asked = httpx.post(f"{backend.url}/internal/reload", headers=backend_headers(), timeout=10)
        assert asked.status_code == 422 and f"export type {names[-1]}" in asked.json()["data"]["removals"]
        assert backend_create(backend.url, {"export_type": names[-1]}).status_code == 201
    log = backend.log()
    assert "config reload refused: it removes export types" in log and '"sighup"' in log
    assert _reloads(backend, "applied") == 0

    applied = httpx.post(f"{backend.url}/internal/reload?allow_removals=true", headers=backend_headers(), timeout=10)
    assert applied.status_code == 200, applied.text
    assert _types(backend) == names[:2] and _reloads(backend, "applied") == 1
    assert_envelope_error(backend_create(backend.url, {"export_type": names[-1]}), 422, 42200)

    # a type added (nothing removed) is applied by the watcher alone
    config = yaml.safe_load(whole[:cut])
    config["export_types"]["late_export"] = config["export_types"][names[0]]
    scratch = backend.config_path.with_name("backend.saving")
    scratch.write_text(_types_last(config))
    scratch.replace(backend.config_path)
    wait_until(lambda: "late_export" in _types(backend), 10, interval=0.05, what="the added type")
    assert backend_create(backend.url, {"export_type": "late_export"}).status_code == 201
