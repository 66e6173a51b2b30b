"""The performance report's count of upstream calls per status-cache TTL window (benchmarks/fill_windows.py).

The samples are those the backend's count would give, read every 10 ms, for caches with a known
behaviour: the count must read exactly one call per task per window for a cache that fills once per
window, whether or not a fill lands on the storm's last instant, and more for one that does not.
"""
from __future__ import annotations

from benchmarks.fill_windows import Sample, Windows, windowed

TTL = 5.0
TASKS = 20
BEFORE = 100


def read_every_10ms(calls: list[float], start: float, end: float) -> list[Sample]:
    """The count a reader sees at each 10 ms tick: the calls made at or before the tick."""
    ticks = [start + i / 100 for i in range(int((end - start) * 100) + 1)]
    return [Sample(t, BEFORE + sum(1 for c in calls if c <= t)) for t in ticks]


def fills(first: float, until: float, processes: int = 1, lag: float = 0.002, late: float = 0.0) -> list[float]:
    """Each process fills each task when its entry expires, `lag` after (the poll and the call); the second
    process's first fills come `late` after the first's."""
    calls = []
    for p in range(processes):
        for task in range(TASKS):
            at = first + p * late + task * 0.0005
            while at <= until:
                calls.append(at)
                at += TTL + lag
    return calls


def test_one_fill_per_window_reads_one_even_when_a_fill_lands_on_the_storms_last_instant() -> None:
    start, end = 0.0, 15.0
    # the first fills at 0.05 s: the fourth, at 15.056 s, lands on the storm's end (polls stop there)
    for until in (14.9, 15.06, 15.2):
        counted = windowed(read_every_10ms(fills(0.05, until), start, until), BEFORE, end, TTL)
        assert counted == Windows(60, 3, 0)
        assert counted.per_window(TASKS) == 1.0


def test_two_processes_each_filling_read_two_in_total() -> None:
    counted = windowed(read_every_10ms(fills(0.3, 15.2, processes=2, late=1.2), 0.0, 15.2), BEFORE, 15.0, TTL)
    assert counted == Windows(120, 3, 0)
    assert counted.per_window(TASKS) == 2.0


def test_a_cache_that_fills_twice_per_window_reads_two_and_its_mid_window_calls_are_strays() -> None:
    calls = fills(0.05, 15.0) + [c + TTL / 2 + 0.1 for c in fills(0.05, 15.0)]
    counted = windowed(read_every_10ms(calls, 0.0, 15.0), BEFORE, 15.0, TTL)
    assert counted.windows == 3
    assert counted.per_window(TASKS) > 1.5
    assert counted.strays == 40  # the second halves of windows 0 and 1, 20 tasks each


def test_a_storm_with_no_call_or_no_whole_window_is_not_measured() -> None:
    assert windowed(read_every_10ms([], 0.0, 4.0), BEFORE, 4.0, TTL).windows == 0
    late = windowed(read_every_10ms(fills(2.0, 4.0), 0.0, 4.0), BEFORE, 4.0, TTL)
    assert late == Windows(20, 0, 0)
