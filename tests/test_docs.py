"""The documentation site builds strict: a broken link, a missing page or a page left out of the nav fails."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_the_readme_stays_an_index() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make run" in readme and "make test" in readme
