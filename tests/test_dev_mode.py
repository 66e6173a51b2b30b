"""Dev mode: the published secrets start a process only in dev mode, and check-config warns about them.

These are the only tests that run the shipped configs' published defaults; the rest
of the suite runs in production mode with generated secrets (tests/conftest.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from exports_common import dev_mode
from exports_common.signing import DownloadSigner
from tests.conftest import ADMIN_TOKEN, backend_config, gateway_config
from tests.helpers import assert_envelope_error
from tests.procs import ROOT, free_port, load_default, merge

PUBLISHED_GATEWAY = {"admin_token": dev_mode.DEV_ADMIN_TOKEN, "public_base_url": "",
                     "download_signing": {"secrets": [dev_mode.DEV_SIGNING_SECRET]},
                     "tenants": load_default("gateway.yaml")["tenants"]}
PUBLISHED_BACKEND = {"download_links": {"base_url": "", "secrets": [dev_mode.DEV_SIGNING_SECRET]},
                     "callbacks": {"secrets": {"demo": sorted(dev_mode.DEV_WEBHOOK_SECRETS)[:1]}}}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != dev_mode.DEV_ENV}
    return dict(env, PYTHONUNBUFFERED="1", **extra)


def _start(module: str, config: dict[str, Any], tmp_path: Path, *flags: str,
           env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    path = tmp_path / f"{module}.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.Popen([sys.executable, "-m", module, "run", "--config", str(path), *flags], cwd=ROOT,
                            env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _published(module: str, tmp_path: Path) -> dict[str, Any]:
    if module == "gateway":
        return merge(gateway_config(tmp_path, "http://127.0.0.1:9"), PUBLISHED_GATEWAY)
    return merge(backend_config(tmp_path), PUBLISHED_BACKEND | {"port": free_port()})


@pytest.mark.parametrize("module,names", [
    ("gateway", ["public_base_url", "admin_token", "GATEWAY_ADMIN_TOKEN", "DOWNLOAD_SIGNING_SECRET", "tenants.demo"]),
    ("backend_stub", ["download_links.base_url", "GATEWAY_PUBLIC_URL", "DOWNLOAD_SIGNING_SECRET",
                      "callbacks.secrets.demo", "BACKEND_SERVICE_TOKEN"]),
])
def test_published_defaults_are_refused_outside_dev_mode(module: str, names: list[str], tmp_path: Path) -> None:
    proc = _start(module, _published(module, tmp_path), tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "refusing to start" in out and "--dev or EXPORTS_DEV=1" in out
    for name in names:
        assert name in out, (name, out)


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.parametrize("module", ["gateway", "backend_stub"])
def test_published_defaults_start_in_dev_mode_and_stop_cleanly_on_ctrl_c(module: str, how: str, tmp_path: Path) -> None:
    config = _published(module, tmp_path)
    if how == "flag":
        proc = _start(module, config, tmp_path, "--dev")
    else:
        proc = _start(module, config, tmp_path, env=_env(**{dev_mode.DEV_ENV: "1"}))
    try:
        _wait_healthy(f"http://127.0.0.1:{config['port']}", proc)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as `make run` passes it on
        out, _ = proc.communicate(timeout=20)
    assert "DEV MODE" in out
    # a stop asked for is a clean exit: no KeyboardInterrupt traceback in the log
    assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]


def _wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


@pytest.mark.parametrize("module,path,warnings", [
    ("gateway", "config/gateway.yaml", 5), ("backend_stub", "config/backend.yaml", 5)])
def test_check_config_warns_about_published_defaults_and_exits_0(module: str, path: str, warnings: int) -> None:
    result = subprocess.run([sys.executable, "-m", module, "check-config", path], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env=_env())
    assert result.returncode == 0, result.stderr
    assert f"OK with {warnings} warning(s)" in result.stdout
    assert result.stderr.count("warning:") == warnings and "dev mode" in result.stderr


def test_check_config_is_quiet_for_production_settings_and_exits_2_on_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    config = gateway_config(tmp_path, "http://127.0.0.1:9")
    for route in config["routes"]:  # the suite's gateways allow loopback callbacks in the older place: not here
        for plugin in route["plugins"]:
            if isinstance(plugin, dict) and "validate" in plugin:
                plugin["validate"].pop("callback", None)
    good.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(good)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == 0 and "warning" not in result.stderr and result.stdout.strip().endswith("OK")
    bad = tmp_path / "bad.yaml"
    bad.write_text("admin_token: x\n")
    result = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(bad)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == 2


def test_a_link_signed_with_the_dev_secret_or_beyond_the_ttl_cap_is_refused(services: Any, tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    config = gateway_config(tmp_path, backend.url, download_signing={"max_link_ttl_sec": 3600})
    gateway = services("gateway", config)
    task_id = "exp-20260101-aaaaaaaaaaaaaaaaaaaa"
    soon, far = int(time.time()) + 600, int(time.time()) + 7200
    forged = DownloadSigner([dev_mode.DEV_SIGNING_SECRET], 10**9)
    real = DownloadSigner(config["download_signing"]["secrets"], 10**9)
    url = f"{gateway.url}/api/v1/exports/{task_id}/download"
    assert_envelope_error(httpx.get(url, params={"expires": soon, "sig": forged.sign(task_id, soon)}), 403, 40300)
    assert_envelope_error(httpx.get(url, params={"expires": far, "sig": real.sign(task_id, far)}), 403, 40300)
    # within the cap, the real secret's signature passes the edge (the task itself does not exist)
    assert httpx.get(url, params={"expires": soon, "sig": real.sign(task_id, soon)}).status_code == 404


def test_a_reload_with_published_defaults_is_refused_outside_dev_mode(services: Any, tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    gateway.config["admin_token"] = dev_mode.DEV_ADMIN_TOKEN
    gateway.write_config()
    resp = httpx.post(f"{gateway.url}/admin/reload", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    body = assert_envelope_error(resp, 422, 42200)
    assert "GATEWAY_ADMIN_TOKEN" in str(body["data"]["problems"])
    assert httpx.get(f"{gateway.url}/admin/breakers",
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
