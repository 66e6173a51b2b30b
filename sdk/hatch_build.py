"""Brings the exports_client package into the SDK's sdist and wheel without moving its code.

In the repository the package sits beside this directory (../exports_client) and is
force-included from there; the sdist carries it at its own top level, where the wheel
built from the sdist finds it as any project's package.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "exports_client"


class CustomBuildHook(BuildHookInterface[BuilderConfig]):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        if (root / PACKAGE / "__init__.py").is_file():  # inside an sdist
            return
        sibling = root.parent / PACKAGE
        if not (sibling / "__init__.py").is_file():
            raise FileNotFoundError(f"no {PACKAGE} package in {root} or {root.parent}")
        build_data["force_include"][str(sibling)] = PACKAGE
