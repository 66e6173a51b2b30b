"""No runtime dependency is pinned narrower than a major version (docs/libraries.md, rule 3), in any distribution
this repository declares; a test or tooling extra may cap a minor only with its reason in a comment on its line.

The image's deploy/requirements.lock is exempt: it is one build's record, made from these ranges by
scripts/lock_image.py, and holds back no upgrade."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import Specifier

from tests.procs import ROOT

pytestmark = pytest.mark.inprocess  # starts no server: `make test-fast` runs it

PYPROJECTS = [ROOT / "pyproject.toml", ROOT / "sdk" / "pyproject.toml", *sorted(ROOT.glob("examples/*/pyproject.toml"))]
MAJOR = re.compile(r"\d+")  # `<2`: below the next major (for 0.x releases, `<1`)


def too_narrow(spec: Specifier) -> bool:
    """Whether the specifier holds back more than a major version: an exact pin, a compatible-release on a patch,
    or an upper bound that is not a major's start."""
    if spec.operator in ("==", "===", "<="):
        return True
    if spec.operator == "~=":
        return spec.version.count(".") > 1
    return spec.operator == "<" and not MAJOR.fullmatch(spec.version)


def requirements(path: Path) -> tuple[list[str], list[str]]:
    """(runtime requirements, optional ones) of one pyproject.toml."""
    project = tomllib.loads(path.read_text())["project"]
    optional = [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
    return list(project.get("dependencies", [])), optional


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_dependencies_are_bounded_by_a_major_version_at_most(path: Path) -> None:
    runtime, _ = requirements(path)
    narrow = [r for r in runtime if any(too_narrow(s) for s in Requirement(r).specifier)]
    assert not narrow, f"{path.relative_to(ROOT)}: pinned narrower than a major version: {narrow}"


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_extra_capped_to_a_minor_says_why(path: Path) -> None:
    _, optional = requirements(path)
    lines = path.read_text().splitlines()
    unexplained = [r for r in optional if any(too_narrow(s) for s in Requirement(r).specifier)
                   and not any(f'"{r}"' in line and "#" in line.partition(f'"{r}"')[2] for line in lines)]
    assert not unexplained, f"{path.relative_to(ROOT)}: capped narrower than a major without a reason: {unexplained}"


def test_too_narrow_tells_a_major_bound_from_a_narrower_one() -> None:
    narrow = ["==1.4.2", "<1.46", "<=2", "~=1.4.2", "<0.3"]
    wide = [">=1.25", "<2", "<1", "~=1.4", "!=1.5.0", ">0.2"]
    assert [too_narrow(Specifier(s)) for s in narrow] == [True] * len(narrow)
    assert [too_narrow(Specifier(s)) for s in wide] == [False] * len(wide)
