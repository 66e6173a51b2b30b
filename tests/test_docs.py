"""The documentation site builds strict: a broken link, a missing page or a page left out of the nav fails."""
from __future__ import annotations

import os
import re
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


def test_the_readmes_links_resolve() -> None:
    """The READMEs are outside the site's strict build: each relative link must name a file that exists."""
    broken = [f"{readme.relative_to(ROOT)} -> {target}"
              for readme in (ROOT / "README.md", ROOT / "sdk" / "README.md", *ROOT.glob("examples/*/README.md"))
              for target in re.findall(r"\]\(([^)#\s]+)", readme.read_text())
              if "://" not in target and not (readme.parent / target).exists()]
    assert not broken, broken


def test_the_generated_reference_pages_are_up_to_date() -> None:
    """docs/reference/ as the code says: config keys, error codes, metric names (`make reference` writes them)."""
    checked = subprocess.run([sys.executable, "-m", "scripts.gen_reference", "--check"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr[-2000:]


def test_the_reference_check_names_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from scripts import gen_reference

    for name in gen_reference.PAGES:
        (tmp_path / name).write_text((gen_reference.REFERENCE / name).read_text())
    errors = tmp_path / "errors.md"
    errors.write_text(errors.read_text().replace("| 42200 | 422 | `VALIDATION`", "| 42200 | 400 | `VALIDATION`"))
    monkeypatch.setattr(gen_reference, "REFERENCE", tmp_path)
    monkeypatch.setattr(gen_reference, "PAGES", {"errors.md": gen_reference.errors_page})
    assert gen_reference.main(["--check"]) == 1
    assert "out of date: docs/reference/errors.md; run `make reference`" in capsys.readouterr().err
    assert gen_reference.main([]) == 0 and gen_reference.main(["--check"]) == 0
    assert "| 42200 | 422 | `VALIDATION`" in errors.read_text()


def test_every_metric_a_page_names_is_one_a_process_serves() -> None:
    """A metric renamed in the code fails here until the pages that name it follow (the generated list is the
    reference; names of config keys and packages that look like metrics are told apart)."""
    reference = ROOT / "docs" / "reference"
    served = set(re.findall(r"^\| `([a-z0-9_]+)` \|", (reference / "metrics.md").read_text(), re.M))
    series = served | {f"{name}{suffix}" for name in served for suffix in ("_bucket", "_sum", "_count")}
    series |= {name.removesuffix("_total") for name in served}
    keys = {part for page in ("gateway-config.md", "backend-config.md")
            for path in re.findall(r"^\| `([^`]+)` \|", (reference / page).read_text(), re.M)
            for part in re.findall(r"[a-z0-9_]+", path)}
    packages = {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
    unknown = {f"{name} ({page.relative_to(ROOT)})"
               for page in (ROOT / "docs").rglob("*.md") if page.parent != reference
               for span in re.findall(r"`([^`]+)`", page.read_text())
               for name in re.findall(r"\b(?:gateway|backend)_[a-z0-9_]+", span)
               if name not in series | keys | packages}
    assert not unknown, sorted(unknown)


def _config_paths() -> set[str]:
    """Every key path of gateway.yaml and backend.yaml as the generated reference lists it, any map key as `<>`."""
    reference = ROOT / "docs" / "reference"
    return {re.sub(r"<[^>]+>", "<>", re.sub(r"\{[A-Za-z]+\}", "", path))
            for page in ("gateway-config.md", "backend-config.md")
            for path in re.findall(r"^\| `([^`]+)` \|", (reference / page).read_text(), re.M)}


def test_every_config_key_path_a_page_names_exists() -> None:
    """A dotted key a page names (`callbacks.retry_delays_sec`, `upstreams.<name>.change_feed`) under a top-level
    key of either file is one the config models have: a renamed or removed key fails here until the pages follow."""
    paths = _config_paths()
    tops = {path.split(".")[0] for path in paths}
    unknown = {f"{span} ({page.relative_to(ROOT)})"
               for page in (ROOT / "docs").rglob("*.md") if page.parent.name != "reference"
               for span in re.findall(r"`([^`\n]+)`", page.read_text())
               if (named := re.fullmatch(r"([a-z_]+(?:\.(?:[a-z_]+|<[^>]+>))+)(?:: [^(]*)?", span)) is not None
               and (key := re.sub(r"<[^>]+>", "<>", named.group(1))).split(".")[0] in tops and key not in paths}
    assert not unknown, sorted(unknown)
