"""One process run under `valgrind --tool=callgrind`: the instructions it executed, whatever the machine's load."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions `argv` executed; its stderr's tail in the error when it fails."""
    with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
        run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", *argv],
                             capture_output=True, text=True, env=os.environ | env)
        if run.returncode != 0:
            raise RuntimeError(f"the driven process failed:\n{run.stderr[-3000:]}")
        return totals(Path(out.name))


def per_operation(module: str, child: list[str], count: int) -> float:
    """One operation's instructions: `python -m module --child *child N` run with N = `count` and with 0, the
    difference over `count` (the start-up and the set-up alike on both sides)."""
    argv = [sys.executable, "-m", module, "--child", *child]
    return (instructions([*argv, str(count)], {}) - instructions([*argv, "0"], {})) / count


def totals(dump: Path) -> int:
    """The instructions a callgrind output file counts."""
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no totals in {dump}")
