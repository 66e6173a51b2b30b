"""Retry budgets per upstream, after Envoy's: retries in flight may be at most a share of the
requests in flight (with a floor), so a failing upstream sees about 1.2x the offered load, never 3x.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator


@dataclass
class RetryBudget:
    requests_in_flight: int = 0
    retries_in_flight: int = 0
    retries_total: int = 0
    exhausted_total: int = 0

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        self.requests_in_flight += 1
        try:
            yield
        finally:
            self.requests_in_flight -= 1

    def try_acquire(self, ratio: float, min_concurrent: int) -> bool:
        allowed = max(min_concurrent, int(self.requests_in_flight * ratio))
        if self.retries_in_flight >= allowed:
            self.exhausted_total += 1
            return False
        self.retries_in_flight += 1
        self.retries_total += 1
        return True

    def release(self) -> None:
        self.retries_in_flight -= 1


class RetryBudgets:
    def __init__(self) -> None:
        self.by_upstream: dict[str, RetryBudget] = {}

    def get(self, upstream: str) -> RetryBudget:
        return self.by_upstream.setdefault(upstream, RetryBudget())
