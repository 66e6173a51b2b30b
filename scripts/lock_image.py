"""deploy/requirements.lock: every Python distribution the cluster image runs, at one exact version each.

The image installs this file with `--no-deps` and then the project itself, so a rebuild next month gets
the same code. It is the runtime closure of the project and of moto's server (the cluster's S3 store),
read from the distributions installed here (`make install`): run it there after changing a dependency.

    python scripts/lock_image.py > deploy/requirements.lock
"""
from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOTS = ("export-gateway", "moto[server]")


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """{canonical name: installed version} of `roots` and everything they require, extras included."""
    pinned: dict[str, str] = {}
    todo = [Requirement(root) for root in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        dist = metadata.distribution(name)
        pinned[name] = dist.version
        for line in dist.requires or []:
            dep = Requirement(line)
            # a marker is evaluated on this interpreter's environment, with each extra asked for
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in ("", *req.extras)):
                todo.append(dep)
    return pinned


def main() -> int:
    print("# Made by `python scripts/lock_image.py > deploy/requirements.lock`; the Dockerfile installs it.")
    for name, version in sorted(closure(ROOTS).items()):
        if name != "export-gateway":
            print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
