"""Upstream calls under a polling storm, counted per status-cache TTL window aligned to the first fill.

The backend counts every API call it receives (`requests` on its /healthz); `CallSampler` reads that
count every 10 ms while the storm runs, noting when each read was sent and answered. The count's first
rise is the storm's first fill, at t0; window j is [t0 + j·TTL, t0 + (j + 1)·TTL). A cached entry
lives a whole TTL from its fill and no process fills before t0, so a task's j-th refill in a process
comes at or after t0 + j·TTL: it can never fall in an earlier window. Under a storm (each task polled
every few milliseconds) it comes right then, late only by the first fills' spread and each fill's
latency, a few milliseconds on a quiet machine: while that lateness adds up to less than a TTL, window
j holds exactly one call per task per process from a cache that coalesces, and the count reads 1.00
per process whatever the storm's edges. `windowed` counts the windows whose middle the polling
reached (3 in a 15 s storm whose first fill comes in its first 2.5 s) and gives each window's calls,
so a lateness that pushed fills out of their window shows as an uneven split.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tests.procs import wait_until

INTERVAL_SEC = 0.01


@dataclass(frozen=True)
class Sample:
    sent: float  # time.monotonic() when the read was sent: every call counted in `calls` had begun by `answered`
    answered: float  # and when its answer came: no call that began after it is counted
    calls: int  # the backend's count of calls


@dataclass(frozen=True)
class Windows:
    per_window: tuple[int, ...]  # the calls in each whole TTL window counted, from t0; () when none

    @property
    def calls(self) -> int:
        return sum(self.per_window)

    @property
    def windows(self) -> int:
        return len(self.per_window)

    def per_task(self, tasks: int) -> float:
        return self.calls / tasks / self.windows


def calls_before(samples: Sequence[Sample], at: float) -> int:
    """The calls begun before `at`, as the last read answered by then counts them (`at` in a lull between fills)."""
    return max((s.calls for s in samples if s.answered <= at), default=samples[0].calls)


def windowed(samples: Sequence[Sample], before: int, polled_until: float, ttl: float) -> Windows:
    """`before`: the count before the storm; `polled_until`: a time the storm surely polled up to."""
    rise = next((i for i, s in enumerate(samples) if s.calls > before), None)
    if rise is None or rise == 0:  # no call at all (every poll answered from a cache filled before, or refused)
        return Windows(())
    first = samples[rise - 1].sent  # the first call began after the backend answered this read
    windows = int((polled_until - first) / ttl + 0.5)  # those whose middle, t0 + (j + ½)·TTL, the polling reached
    if samples[-1].answered < first + windows * ttl:
        raise ValueError("the count was not read up to the end of the last window")
    edges = [calls_before(samples, first + j * ttl) if j else before for j in range(windows + 1)]
    return Windows(tuple(b - a for a, b in itertools.pairwise(edges)))


class CallSampler:
    """Reads the backend's call count every INTERVAL_SEC on a thread of its own, from `start` until `stop`."""

    def __init__(self, backend_url: str, longest_sec: float) -> None:
        self.url = f"{backend_url}/healthz"
        self.longest_sec = longest_sec  # it stops by itself after this long
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="call-sampler", daemon=True)
        self._client = httpx.Client(timeout=5.0)

    def _read(self) -> None:
        sent = time.monotonic()
        calls = int(self._client.get(self.url).json()["data"]["requests"])
        self.samples.append(Sample(sent, time.monotonic(), calls))

    def _run(self) -> None:
        deadline = time.monotonic() + self.longest_sec
        while not self._stop.wait(INTERVAL_SEC) and time.monotonic() < deadline:
            self._read()

    def start(self) -> int:
        """Reads once before returning (the count before the storm), then goes on on its thread."""
        self._read()
        self._thread.start()
        return self.samples[0].calls

    def stop(self, after: float) -> list[Sample]:
        """Once a read answered after `after` (time.monotonic())."""
        wait_until(lambda: self.samples[-1].answered > after, max(0.0, after - time.monotonic()) + 10,
                   what="the backend's call count read to the end of the last window")
        self._stop.set()
        self._thread.join()
        self._client.close()
        return self.samples
