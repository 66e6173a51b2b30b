"""The performance report's count of upstream calls per status-cache TTL window (benchmarks/fill_windows.py).

The samples are those the backend's count would give, read every 10 ms (each read answered 3 ms after
it is sent), for caches with a known behaviour: the count must read exactly one call per task per
window for a cache that fills once per window, whether or not a fill lands on the storm's last instant
and whatever each fill's latency up to a share of the TTL, and more for one that does not.
"""
from __future__ import annotations

from benchmarks.fill_windows import Sample, Windows, windowed

TTL = 5.0
TASKS = 20
BEFORE = 100


def read_every_10ms(calls: list[float], start: float, end: float) -> list[Sample]:
    """The reads sent every 10 ms, each answered 3 ms later with the calls begun 1 ms after it was sent."""
    ticks = [start + i / 100 for i in range(int((end - start) * 100) + 1)]
    return [Sample(t, t + 0.003, BEFORE + sum(1 for c in calls if c <= t + 0.001)) for t in ticks]


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
    # the first fills at 0.05 s: the fourth, at 15.056 s, lands on the storm's end (polls stop there)
    for until in (14.9, 15.06, 15.2):
        counted = windowed(read_every_10ms(fills(0.05, until), 0.0, 17.6), BEFORE, 15.0, TTL)
        assert counted == Windows((20, 20, 20))
        assert counted.per_task(TASKS) == 1.0


def test_a_fill_latency_of_a_second_and_a_half_still_reads_one_per_window() -> None:
    counted = windowed(read_every_10ms(fills(0.05, 15.0, lag=1.5), 0.0, 17.6), BEFORE, 15.0, TTL)
    assert counted == Windows((20, 20, 20))


def test_two_processes_each_filling_read_two_in_total() -> None:
    calls = fills(0.3, 15.2, processes=2, late=1.2)
    counted = windowed(read_every_10ms(calls, 0.0, 17.6), BEFORE, 15.0, TTL)
    assert counted == Windows((40, 40, 40))
    assert counted.per_task(TASKS) == 2.0


def test_a_cache_that_fills_twice_per_window_reads_two() -> None:
    calls = fills(0.05, 15.0) + [c + TTL / 2 for c in fills(0.05, 15.0)]
    counted = windowed(read_every_10ms(calls, 0.0, 17.6), BEFORE, 15.0, TTL)
    assert counted == Windows((40, 40, 40))


def test_a_storm_with_no_call_or_no_whole_window_is_not_measured() -> None:
    assert windowed(read_every_10ms([], 0.0, 4.0), BEFORE, 4.0, TTL).windows == 0
    assert windowed(read_every_10ms(fills(2.0, 4.0), 0.0, 6.6), BEFORE, 4.0, TTL).windows == 0
