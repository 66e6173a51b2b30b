"""`python -m benchmarks.report`: the figures of docs/performance.md, run on this machine, and the page itself.

    python -m benchmarks.report                  # every section (under 20 minutes), writes docs/performance.md
    python -m benchmarks.report --only accuracy  # one section
    python -m benchmarks.report --quick          # short runs, a smoke test of the command
    python -m benchmarks.report --only accuracy --processes 2 --processes 8  # rate-limit accuracy at 2 and 8

The page names the machine (cores, load average at the start and the end), the commit measured (and
whether the tree had changes not committed) and the command. Only a full run (no --quick, no --only)
writes docs/performance.md unless --out says where; the others write /tmp/performance-<...>.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import report_runs as runs
from benchmarks.bench_push import raise_open_files
from tests.procs import ROOT

PAGE = ROOT / "docs" / "performance.md"

# name: (heading, what the figure answers, the run)
SECTIONS: dict[str, tuple[str, str, Callable[[runs.Settings], str]]] = {
    "plugins": ("Per-plugin cost", "What each plugin of the shipped chains costs, one left out at a time: the main "
                "figure is the gateway process's CPU time (user + sys, from /proc) over a 10 s wrk run (1 thread, 32 "
                "connections, after 1 s of warm-up, at a fixed offered rate per chain) divided by the requests it "
                "served. The chain is measured twice "
                "in the same run (full A first, full B last); their difference is the run's noise, and a plugin's "
                "p99 is given only where it exceeds that.", runs.plugin_cost),
    "accuracy": ("Rate-limit accuracy across gateway processes", "How close the shared limit stays to what it "
                 "promises when several gateway processes share it through one Redis, and what each process does "
                 "with Redis down.", runs.accuracy),
    "coalescing": ("Coalescing under a polling storm", "How many upstream calls a storm of polling clients costs.",
                   runs.coalescing),
    "degradation": ("Degradation during a backend outage", "What clients get while the backend is down, and "
                    "whether anything accepted is lost.", runs.degradation),
    "push": ("Push vs poll", "Backend requests per task followed to the end, streamed against polled.",
             runs.push_vs_poll),
    "guarantees": ("What each guarantee costs", "Gateway CPU per request with and without the plugins that give "
                   "a guarantee: idempotency and the outbox on a submit (exactly once; nothing lost while the "
                   "backend is down), the status cache on a poll of a finished task (coalescing). Same method as the "
                   "per-plugin cost.", runs.guarantee_costs),
}

# figures this report does not measure again, from benchmarks/RESULTS.md, with the date they were taken
CARRIED_OVER = [
    ("Cache-hit status poll, gateway / bare Starlette (one core each, wrk, in turns, quiet machine; three runs; "
     "Intel Xeon, 2 vCPUs)", "0.57 / 0.57 / 0.56 (goal ≥ 0.70: missed)", "2026-12-02",
     "Session 7: the guard on the merged main"),
    ("Uncached list call, gateway / minimal aiohttp proxy (in turns; three runs)",
     "0.88 / 0.90 / 0.89, p99 1.05-1.16x (goal ≥ 0.80, p99 ≤ 2x)", "2026-12-02",
     "Session 7: the guard on the merged main"),
    ("Cache-hit poll on Redis, `run --workers 2` / one worker (three runs)", "1.65 / 1.59 / 1.55x (goal ≥ 1.4x)",
     "2026-12-02", "Session 7: the guard on the merged main"),
    ("Retry amplification, backend failing 100 % with the breaker kept closed: backend / client requests",
     "1.198 (goal ≤ 1.2)", "2026-11-29 or later", "Resilience (issue 4)"),
    ("Event streams at scale: backend requests/min for 5,000 watchers of 50 tasks, change feed vs SDK polling",
     "0 vs 14,981", "2026-12-01", "Push: task status as server-sent events (issue 25)"),
]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def header(command: str, commit: str, dirty: bool, started: datetime, load_start: str, load_end: str,
           minutes: float, quick: bool) -> list[str]:
    state = "with changes not committed: the figures are of that tree" if dirty else "clean"
    lines = [
        "# Performance", "",
        "Every figure on this page was measured by one command, in one run, on the machine described below; "
        "each is a ratio or a count taken within that run, so a loaded machine moves it little. Figures not "
        "measured again are marked *carried over* with the date they were taken (from `benchmarks/RESULTS.md`, "
        "which holds every benchmark's history and the command that made it).", "",
        f"- **Command:** `{command}` ({minutes:.1f} minutes)",
        f"- **Commit:** `{commit}` (tree {state})",
        f"- **Measured:** {started:%Y-%m-%d %H:%M} UTC",
        f"- **Machine:** {os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; gateway, backend, Redis and load generators share the cores",
        f"- **Load average** (1 / 5 / 15 min): {load_start} at the start, {load_end} at the end",
    ]
    if quick:
        lines += ["", "!!! warning", "    A `--quick` run: every duration is short; a smoke test of the command, "
                  "not figures to quote."]
    return [*lines, ""]


def page(command: str, commit: str, dirty: bool, started: datetime, load_start: str, load_end: str, minutes: float,
         quick: bool, bodies: dict[str, str]) -> str:
    lines = header(command, commit, dirty, started, load_start, load_end, minutes, quick)
    for number, (name, (title, intro, _)) in enumerate(SECTIONS.items(), 1):
        lines += [f"## {number}. {title}", "", intro, ""]
        lines += [bodies.get(name, f"Not run this time (`--only`): `python -m benchmarks.report --only {name}`."), ""]
    lines += ["## Carried over", "", "Figures this command does not measure again, with the day they were taken.",
              "", "| figure | value | source |", "|---|---|---|"]
    lines += [f"| {what} | {value} | carried over from `benchmarks/RESULTS.md` ({where}), {day} |"
              for what, value, day, where in CARRIED_OVER]
    lines += ["", "Run it yourself: `python -m benchmarks.report` (under 20 minutes; `--only NAME` runs one section "
              f"of {', '.join(SECTIONS)}; `--quick` is a smoke test with short durations). It needs wrk, "
              "redis-server and the project's environment (`make install`). What the hot path does per request and "
              "how it is measured: [The hot path](design/hot-path.md).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(SECTIONS), action="append", help="run this section (repeatable)")
    parser.add_argument("--quick", action="store_true", help="short durations: a smoke test")
    parser.add_argument("--processes", type=int, action="append", choices=range(1, 17), metavar="N",
                        help="the accuracy section at N gateway processes (repeatable; default 1, 2, 4 and 8)")
    parser.add_argument("--out", type=Path, help="where the page goes (default: docs/performance.md for a full run)")
    args = parser.parse_args()
    names = args.only or list(SECTIONS)
    full = not args.quick and not args.only and not args.processes
    out = args.out or (PAGE if full else Path(f"/tmp/performance-{'quick-' if args.quick else ''}{'-'.join(names)}.md"))
    command = " ".join(["python -m benchmarks.report", *sys.argv[1:]])
    commit, dirty = git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    raise_open_files()  # 1,000 polling connections
    started, began, load_start = datetime.now(UTC), time.monotonic(), load()
    print(f"{command}: commit {commit}{' (dirty)' if dirty else ''}, load {load_start}", flush=True)
    settings = runs.Settings(args.quick, tuple(args.processes)) if args.processes else runs.Settings(args.quick)
    bodies = {}
    for name in names:
        with runs.section(name):
            bodies[name] = SECTIONS[name][2](settings)
    minutes = (time.monotonic() - began) / 60
    out.write_text(page(command, commit, dirty, started, load_start, load(), minutes, args.quick, bodies))
    print(f"wrote {out} ({minutes:.1f} minutes, load at the end {load()})", flush=True)


if __name__ == "__main__":
    main()
