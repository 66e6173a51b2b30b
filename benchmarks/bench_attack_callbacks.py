"""Bad-callback flood: another tenant's callback delay with and without 100 hostile receivers (same run).

    python -m benchmarks.bench_attack_callbacks

One backend process; tenant demo2 submits tasks whose receiver answers at once, and
the delay from each task's completion to its delivery is measured, first on a quiet
backend, then while tenant demo's 100 tasks call back to receivers that reset,
stay silent, trickle a status line, send an endless body, redirect, or do not
resolve (tests/test_callback_fairness.py builds the scenario).
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from tests.conftest import _starter
from tests.receiver import Receiver
from tests.test_callback_fairness import delivery_delays, fairness_backend, hostile_urls, start_flood

SAMPLES = 10


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, _starter(Path(tmp)) as start:
        backend = fairness_backend(start, Path(tmp))
        with Receiver() as good, hostile_urls() as urls:
            quiet = delivery_delays(backend, good, SAMPLES)
            start_flood(backend, urls)
            loud = delivery_delays(backend, good, SAMPLES)
    for name, delays in (("quiet", quiet), ("under flood", loud)):
        print(f"demo2 callback delay {name:>11}: median {statistics.median(delays) * 1000:6.0f} ms, "
              f"max {max(delays) * 1000:6.0f} ms ({len(delays)} deliveries)")
    print(f"ratio of medians (flood / quiet): {statistics.median(loud) / statistics.median(quiet):.2f}")


if __name__ == "__main__":
    main()
