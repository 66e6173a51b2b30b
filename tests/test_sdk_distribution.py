"""The client SDK as a distribution of its own: built from sdk/, installed alone in a fresh virtualenv, used for real.

The wheel is installed with its dependencies resolved by pip (from the index, through
pip's cache where it keeps one), so the test sees the closure a client would get.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from exports_client import __version__
from tests.client_stack import start_stack
from tests.conftest import DEMO_KEY
from tests.procs import ROOT, Service

# what the SDK needs: httpx, rich for exportctl's progress bar, standardwebhooks for verify_webhook
SDK_DEPENDS = ("httpx", "rich", "standardwebhooks")
# what the server side needs and a client must not get with the SDK
SERVER_ONLY = ("export-gateway", "starlette", "uvicorn", "redis", "pydantic", "orjson", "aiohttp", "pyyaml",
               "obstore", "watchfiles", "opentelemetry-api", "prometheus-client")


@dataclass(frozen=True)
class Installed:
    venv: Path
    workdir: Path  # outside the repository, so nothing of it is importable from the current directory

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=120, cwd=self.workdir,
                              env={**clean, "PYTHONNOUSERSITE": "1", **(env or {})})

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "python"), "-c", code)

    def exportctl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "exportctl"), *args, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("sdk-distribution")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work / "dist"),
                            str(ROOT / "sdk")], check=False, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (work / "dist").glob("exports_client-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    # the outer pip installs into the new environment, which then holds the SDK and its dependencies alone
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--disable-pip-version-check", str(wheel)], check=False, capture_output=True, text=True,
                         timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    home = work / "home"
    home.mkdir()
    return Installed(venv, home)


def test_the_sdk_installs_alone_with_its_dependencies_and_nothing_of_the_server(installed: Installed) -> None:
    out = installed.python(
        "import importlib.metadata as m, json, exports_client, exports_client.cli, exports_client.aio\n"
        "print(json.dumps({'dists': sorted(d.metadata['Name'].lower() for d in m.distributions()),\n"
        "                  'requires': m.requires('exports-client'), 'version': m.version('exports-client'),\n"
        "                  'file': exports_client.__file__, 'module_version': exports_client.__version__}))")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert {"exports-client", *SDK_DEPENDS} <= set(found["dists"])
    assert not set(SERVER_ONLY) & set(found["dists"]), found["dists"]
    assert {re.split(r"[<>=!~; ]", r, maxsplit=1)[0] for r in found["requires"]} == set(SDK_DEPENDS)
    assert found["version"] == found["module_version"] == __version__
    assert Path(found["file"]).is_relative_to(installed.venv)  # the installed copy, not the repository's


def test_the_root_bundles_the_sdk_with_the_same_dependencies_and_never_depends_on_it_by_name() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())
    depends = root["project"]["dependencies"]
    assert sorted(sdk["project"]["dependencies"]) == sorted(d for d in depends if d.startswith(SDK_DEPENDS))
    assert not [d for d in depends if re.match(r"exports[-_.]client\b", d, re.IGNORECASE)]
    assert "exports_client*" in root["tool"]["setuptools"]["packages"]["find"]["include"]
    assert root["project"]["scripts"]["exportctl"] == sdk["project"]["scripts"]["exportctl"]


def test_exportctl_from_the_sdk_alone_helps_and_makes_a_round_trip(
        installed: Installed, module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory,
        tmp_path: Path) -> None:
    helped = installed.exportctl("--help")
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("submit", "wait", "download")), helped.stderr
    version = installed.exportctl("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"exportctl {__version__}"

    stack = start_stack(module_services, tmp_path_factory.mktemp("sdk-distribution-stack"))
    dest = tmp_path / "report.csv"
    env = {"EXPORTS_URL": stack.gateway.url, "EXPORTS_API_KEY": DEMO_KEY}
    out = installed.exportctl("submit", "report_export", "--filter", "metric=revenue", "--download", str(dest),
                              "--json", env=env)
    assert out.returncode == 0, out.stderr
    task = json.loads(out.stdout)
    assert task["status"] == "COMPLETED" and dest.stat().st_size == task["result"]["bytes"]
    lines = dest.read_text().splitlines()
    assert lines[0].startswith("day,") and len(lines) == task["result"]["rows"] + 1
    assert {line.split(",")[2] for line in lines[1:]} == {"revenue"}
