"""`python -m gateway`: every subcommand is listed by --help and each has its own help."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gateway.__main__ import cli
from gateway.tenants import hash_key
from tests.procs import ROOT

pytestmark = pytest.mark.inprocess

COMMANDS = ("run", "check-config", "schema", "plugins", "hash-key", "migrate-config", "conformance")


def test_help_lists_every_subcommand() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    listed = re.findall(r"^ {4}([a-z-]+)", result.stdout, re.M)
    assert listed == list(COMMANDS), result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli([command, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: gateway {command}")
    assert hash_key("--help") not in shown


def test_hash_key_hashes_the_key_and_takes_one_that_starts_with_a_dash(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["hash-key", "demo-key-change-me"]) == 0
    assert cli(["hash-key", "--", "-dash-key"]) == 0
    assert capsys.readouterr().out.split() == [hash_key("demo-key-change-me"), hash_key("-dash-key")]
    with pytest.raises(SystemExit) as exited:
        cli(["hash-key"])
    assert exited.value.code == 2
    assert "the following arguments are required: key" in capsys.readouterr().err


def test_plugins_lists_the_installed_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["plugins"]) == 0
    assert "tenant_allowlist" in capsys.readouterr().out
