"""docs/performance.md (written by `python -m benchmarks.report`) names the commit it was measured on, and that
commit is in this checkout's history: figures are traceable to the code that made them."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.procs import ROOT

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

PAGE = ROOT / "docs" / "performance.md"
COMMIT = re.compile(r"^- \*\*Commit:\*\* `([0-9a-f]{40})`", re.MULTILINE)


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def measured_commit() -> str:
    found = COMMIT.search(PAGE.read_text())
    assert found, "docs/performance.md names no commit (`- **Commit:** `<40 hex>``): run python -m benchmarks.report"
    return found.group(1)


def test_the_page_names_the_commit_it_was_measured_on() -> None:
    assert "python -m benchmarks.report" in PAGE.read_text()
    assert len(measured_commit()) == 40


def test_the_measured_commit_is_in_the_history() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("no .git: this is not a git checkout, so the history cannot be checked")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    shallow = git("rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("a shallow clone: the measured commit may be older than the history fetched")
    commit = measured_commit()
    found = git("merge-base", "--is-ancestor", commit, "HEAD")
    assert found.returncode == 0, (
        f"docs/performance.md was measured on {commit}, which is not in this branch's history "
        f"({found.stderr.strip() or 'not an ancestor of HEAD'}): run python -m benchmarks.report again and commit "
        "the page")
