"""Runs wrk (from Debian's packages) and reads its summary; the one load generator for every benchmark.

wrk is used, not a Python generator, because a Python client saturates a core
long before the servers here do, and the machine has only two.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int

    def line(self) -> str:
        return (f"{self.rps:9.0f} req/s   p50 {self.p50_ms:6.2f} ms   p99 {self.p99_ms:6.2f} ms   "
                f"({self.requests} requests, {self.errors} non-2xx/errors)")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * _UNITS[unit] * 1000


def require_wrk() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk (make bench does it)")
    return path


def run(url: str, seconds: float = 8, connections: int = 32, threads: int = 1, headers: dict[str, str] | None = None,
        lua: str | None = None, cpu: int | None = None) -> WrkResult:
    """`cpu`: run wrk on that core alone (see harness.pin)."""
    return run_with_output(url, seconds, connections, threads, headers, lua, cpu)[0]


def run_with_output(url: str, seconds: float = 8, connections: int = 32, threads: int = 1,
                    headers: dict[str, str] | None = None, lua: str | None = None, cpu: int | None = None
                    ) -> tuple[WrkResult, str]:
    """`run`, with what wrk printed (a Lua script's `done` may print its own counts there)."""
    cmd = [require_wrk(), f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    with tempfile.TemporaryDirectory() as tmp:
        if lua:
            script = Path(tmp) / "script.lua"
            script.write_text(lua)
            cmd += ["-s", str(script)]
        pinned = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
        out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=seconds + 30,
                             preexec_fn=pinned).stdout
    if "Requests/sec" not in out:
        raise RuntimeError(f"wrk printed no summary for {url}:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(bad.group(1)) if bad else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    return WrkResult(rps, p50, p99, requests, errors), out
