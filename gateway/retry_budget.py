"""Retry budgets per upstream: retries may add at most a share of the offered load.

Two limits, both from the route's `ratio` and `min_concurrent`:
- a count budget, after Finagle's RetryBudget: over the last `WINDOW_SEC`
  seconds, retries may number at most max(`ratio` x requests, `min_concurrent`),
  so a backend failing every request sees about 1.2x the load, never 3x;
- a concurrency cap, after Envoy's: retries in flight at most
  max(min_concurrent, ratio x requests in flight), so a burst cannot spend the
  whole allowance at once.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

WINDOW_SEC = 10


@dataclass
class RetryBudget:
    requests_in_flight: int = 0
    retries_in_flight: int = 0
    requests_total: int = 0
    retries_total: int = 0
    exhausted_total: int = 0
    # per second: [second, requests, retries]; the last WINDOW_SEC seconds
    _window: deque[list[int]] = field(default_factory=deque, repr=False)

    def _bucket(self) -> list[int]:
        now = int(time.monotonic())
        window = self._window
        if window and window[-1][0] == now:  # this second's: the older ones were dropped when it began
            return window[-1]
        while window and window[0][0] <= now - WINDOW_SEC:
            window.popleft()
        window.append([now, 0, 0])
        return window[-1]

    def request_started(self) -> None:
        self._bucket()[1] += 1
        self.requests_total += 1
        self.requests_in_flight += 1

    def request_ended(self) -> None:
        self.requests_in_flight -= 1

    def try_acquire(self, ratio: float, min_concurrent: int) -> bool:
        bucket = self._bucket()
        requests = sum(b[1] for b in self._window)
        retries = sum(b[2] for b in self._window)
        concurrent = max(min_concurrent, int(self.requests_in_flight * ratio))
        if retries + 1 > max(ratio * requests, min_concurrent) or self.retries_in_flight >= concurrent:
            self.exhausted_total += 1
            return False
        bucket[2] += 1
        self.retries_in_flight += 1
        self.retries_total += 1
        return True

    def release(self) -> None:
        self.retries_in_flight -= 1

    def describe(self) -> dict[str, int]:
        return {"requests_in_flight": self.requests_in_flight, "retries_in_flight": self.retries_in_flight,
                "requests_total": self.requests_total, "retries_total": self.retries_total,
                "exhausted_total": self.exhausted_total}


class RetryBudgets:
    def __init__(self) -> None:
        self.by_upstream: dict[str, RetryBudget] = {}

    def get(self, upstream: str) -> RetryBudget:
        budget = self.by_upstream.get(upstream)
        if budget is None:  # not setdefault: that would build a budget on every request
            budget = self.by_upstream[upstream] = RetryBudget()
        return budget
