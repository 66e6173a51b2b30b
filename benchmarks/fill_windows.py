"""Upstream calls under a polling storm, counted over whole status-cache TTL windows aligned to the first fill.

The backend counts every API call it receives (`requests` on its /healthz); `CallSampler` reads that
count every 10 ms while the storm runs. Its first rise is the storm's first fill, at t0; window j is
[t0 + j·TTL, t0 + (j + 1)·TTL). A cached entry lives a whole TTL from its fill, so a task's next fill
in a process comes no earlier than one TTL after its last, and under a storm (each task polled every
millisecond or so) right then: a cache that coalesces makes one call per task per window, at the
window's start. `windowed` counts from t0 to the middle of the last window the polling covered,
t0 + (k - ½)·TTL: every fill of windows 0 .. k-1 lies before that point and none of window k can,
so such a cache reads exactly 1.00 per task per window per process, whatever the storm's edges (a
fill landing on the storm's last instant is neither counted against a window barely polled nor
half-missed). The count holds while the first fills of all processes land within half a TTL of t0;
`strays` counts the calls in windows' second halves, which a cache filling on time never makes.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

INTERVAL_SEC = 0.01
# a call this close (as a share of the TTL) before a window's start is its fill, read a little early
EARLY_SHARE = 0.1


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic() when the read was sent
    calls: int  # the backend's count of calls then


@dataclass(frozen=True)
class Windows:
    calls: int  # from t0 to t0 + (windows - ½)·TTL; with no window, all the storm's
    windows: int  # whole TTL windows counted: 0 when the storm held none after its first fill
    strays: int  # of `calls`, those in the second half of a window

    def per_window(self, tasks: int) -> float:
        return self.calls / tasks / self.windows


def calls_at(samples: Sequence[Sample], at: float) -> int:
    """The count read last at or before `at` (samples in the order taken)."""
    return max((s.calls for s in samples if s.at <= at), default=samples[0].calls)


def windowed(samples: Sequence[Sample], before: int, polled_until: float, ttl: float) -> Windows:
    """`before`: the count before the storm; `polled_until`: a time the storm surely polled up to."""
    first = next((s.at for s in samples if s.calls > before), None)
    if first is None:  # no call at all: every poll answered from a cache filled before, or refused
        return Windows(0, 0, 0)
    windows = int((polled_until - first) / ttl + 0.5)  # the last with t0 + (k - ½)·TTL within the polling
    if windows < 1:  # the first fill came in the storm's last half TTL
        return Windows(calls_at(samples, polled_until) - before, 0, 0)
    calls = calls_at(samples, first + (windows - 0.5) * ttl) - before
    strays = sum(calls_at(samples, first + (j + 1 - EARLY_SHARE) * ttl) - calls_at(samples, first + (j + 0.5) * ttl)
                 for j in range(windows - 1))
    return Windows(calls, windows, strays)


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
        at = time.monotonic()
        self.samples.append(Sample(at, int(self._client.get(self.url).json()["data"]["requests"])))

    def _run(self) -> None:
        deadline = time.monotonic() + self.longest_sec
        while not self._stop.wait(INTERVAL_SEC) and time.monotonic() < deadline:
            self._read()

    def start(self) -> int:
        """Reads once before returning (the count before the storm), then goes on on its thread."""
        self._read()
        self._thread.start()
        return self.samples[0].calls

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        self._client.close()
        return self.samples
