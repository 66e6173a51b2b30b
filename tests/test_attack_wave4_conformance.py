"""Attacks on the conformance kit: a task service that answers every route with the right status and a body of
the wrong shape, or a change feed whose first line never ends, fails the checks it breaks, line by line, and
exits 1 in bounded time and memory, without a traceback; so does one whose answer never ends."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.conformance import REQUIRED
from tests.procs import ROOT, free_port, stand_in, uvicorn_command


@pytest.fixture
def hostile(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    port = free_port()
    with stand_in(uvicorn_command("tests.hostile_task_service:app", port), port, "the hostile service",
                  env={"SHAPE": request.param, "PATH": "/usr/bin:/bin"}, log=tmp_path / "hostile.log") as url:
        yield url


def conformance(upstream: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "conformance", "--upstream", upstream], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("hostile", ["wrong", "endless"], indirect=True)
def test_answers_of_the_wrong_shape_fail_their_checks_without_a_traceback(hostile: str) -> None:
    run = conformance(hostile)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    verdicts = {line[9:].split(":", 1)[0].split(" (", 1)[0] for line in run.stdout.splitlines()
                if line[:8].strip() in ("PASS", "FAIL", "OPTIONAL")}
    assert {name for name, _ in REQUIRED} <= verdicts, run.stdout
    assert "FAIL     create with the gateway's task id: an answer does not have the contract's shape" in run.stdout
    assert "OPTIONAL change feed (GET /events)" in run.stdout, run.stdout


@pytest.mark.parametrize("hostile", ["huge"], indirect=True)
def test_an_answer_that_never_ends_fails_its_check_at_the_bound_and_the_run_goes_on(hostile: str) -> None:
    run = conformance(hostile)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert "FAIL     export types, with an ETag: the request failed: ReadError: the answer passed" in run.stdout
    assert "FAIL     create with the gateway's task id" in run.stdout, run.stdout


@pytest.mark.parametrize("hostile", ["endless"], indirect=True)
def test_a_change_feed_line_that_never_ends_is_cut_at_its_bound(hostile: str) -> None:
    run = conformance(hostile)
    assert "OPTIONAL change feed (GET /events): the feed's first line passed 1048576 bytes" in run.stdout, run.stdout


def test_an_upstream_nobody_listens_on_fails_every_check_and_exits_1() -> None:
    run = conformance(f"http://127.0.0.1:{free_port()}")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert f"0 of {len(REQUIRED)} required checks passed" in run.stdout
