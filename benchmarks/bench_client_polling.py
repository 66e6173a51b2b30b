"""The client SDK's polling cost and herd behaviour, on a simulated clock (runs in seconds).

1. Polling cost: `ExportsClient.wait` (the real method, through an httpx
   MockTransport) against a stub that answers status polls as the gateway does
   (`Retry-After` 1 s doubling to 30 s by the task's age, from
   gateway/plugins/status_cache.py's own `poll_interval`), for tasks of 5 s, 60 s and
   300 s; reference: a naive poller asking every 1 s. Reports status requests per
   task, their ratio, and how late the completion was noticed.
2. Herd: 2,000 clients waiting on long tasks (started over one minute) through a
   30 s outage answered 503 with `Retry-After` set to the outage's end (everyone told
   to come back at the same moment). Each client's timing is the SDK's scheduler
   (`PollPlan`, which `wait` runs); reference: clients that obey `Retry-After` exactly.
   Reports the busiest second against the mean rate (goal: at most twice).

    python -m benchmarks.bench_client_polling
"""
from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from exports_client import ExportsClient
from exports_client.models import Task
from exports_client.polling import PollPlan, plan_for
from gateway.plugins.status_cache import poll_interval

TASK_ID = "exp-20261129-aaaaaaaaaaaaaaaa"


def gateway_retry_after(age_sec: float) -> int:
    return poll_interval(age_sec, 1, 30)


class SimClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def _stub(clock: SimClock, duration: float, polls: list[float]) -> Callable[[httpx.Request], httpx.Response]:
    def handle(request: httpx.Request) -> httpx.Response:
        polls.append(clock.t)
        done = clock.t >= duration
        data = {"task_id": TASK_ID, "status": "COMPLETED" if done else "RUNNING",
                "progress": 100 if done else int(100 * clock.t / duration)}
        headers = {} if done else {"Retry-After": str(gateway_retry_after(clock.t))}
        return httpx.Response(200, headers=headers, json={"code": 0, "message": "success", "data": data})

    return handle


@dataclass(frozen=True)
class CostRow:
    duration_sec: int
    sdk_requests: float
    naive_requests: float
    ratio: float
    mean_late_sec: float
    max_late_sec: float


def polling_cost(duration: int, runs: int = 50, seed: int = 0) -> CostRow:
    """Each run's task lasts `duration` ±10% (so the end falls anywhere between two polls); mean over runs."""
    counts, naive_counts, lates = [], [], []
    rng = random.Random(seed)
    for run in range(runs):
        lasts = duration * rng.uniform(0.9, 1.1)
        clock, polls = SimClock(), list[float]()
        with ExportsClient("http://gateway.sim", "key", transport=httpx.MockTransport(_stub(clock, lasts, polls)),
                           clock=clock.now, sleep=clock.sleep, rng=random.Random(seed * 1000 + run)) as client:
            client.wait(TASK_ID, max_wait=duration + 120)
        counts.append(len(polls))
        naive_counts.append(math.ceil(lasts) + 1)  # a poll at 0, 1, 2, ... s: the first one after the end sees it
        lates.append(polls[-1] - lasts)
    sdk, naive = statistics.mean(counts), statistics.mean(naive_counts)
    return CostRow(duration, sdk, naive, sdk / naive, statistics.mean(lates), max(lates))


@dataclass(frozen=True)
class HerdResult:
    clients: int
    mean_per_sec: float
    peak_per_sec: int
    peak_second: int
    exact_peak_per_sec: int
    exact_mean_per_sec: float


OUTAGE = (120.0, 150.0)
WINDOW = (90, 330)  # 30 s before the outage to 180 s after it


def _simulate(clients: int, seed: int, sdk: bool) -> Counter[int]:
    rng = random.Random(seed)
    starts = [rng.uniform(0, 60) for _ in range(clients)]
    plans: list[PollPlan] = [plan_for(TASK_ID, s, 3600, random.Random(seed + i)) for i, s in enumerate(starts)]
    heap = [(s, i) for i, s in enumerate(starts)]
    heapq.heapify(heap)
    per_second: Counter[int] = Counter()
    while heap:
        now, i = heapq.heappop(heap)
        if now >= WINDOW[1]:
            break
        per_second[int(now)] += 1
        plan = plans[i]
        if OUTAGE[0] <= now < OUTAGE[1]:
            asked = float(max(1, math.ceil(OUTAGE[1] - now)))
            if sdk:
                plan.refused(now, asked)
            else:
                plan.not_before = now + asked
        else:
            asked = float(gateway_retry_after(now - starts[i]))
            if sdk:
                plan.answered(now, Task(TASK_ID, "RUNNING"), asked)
            else:
                plan.not_before = now + asked
        heapq.heappush(heap, (plan.not_before, i))
    return per_second


def _peak_and_mean(per_second: Counter[int]) -> tuple[int, int, float]:
    seconds = range(*WINDOW)
    peak_second = max(seconds, key=lambda s: per_second[s])
    return per_second[peak_second], peak_second, sum(per_second[s] for s in seconds) / len(seconds)


def herd(clients: int = 2000, seed: int = 0) -> HerdResult:
    peak, second, mean = _peak_and_mean(_simulate(clients, seed, sdk=True))
    exact_peak, _, exact_mean = _peak_and_mean(_simulate(clients, seed, sdk=False))
    return HerdResult(clients, mean, peak, second, exact_peak, exact_mean)


def main() -> None:
    print("polling cost per task (mean of 50 runs, each task ±10% of the length; naive: one poll a second)")
    print("| task | wait(): status requests | naive 1 s poller | ratio (goal ≤ 0.25 at 300 s) "
          "| noticed late: mean / max (goal ≤ 30 s) |")
    for duration in (5, 60, 300):
        row = polling_cost(duration)
        print(f"| {duration} s | {row.sdk_requests:.1f} | {row.naive_requests:.1f} | {row.ratio:.3f} "
              f"| {row.mean_late_sec:.1f} / {row.max_late_sec:.1f} s |")
    result = herd()
    print(f"herd: {result.clients} clients, outage {OUTAGE[0]:.0f}-{OUTAGE[1]:.0f} s, window {WINDOW[0]}-{WINDOW[1]} s")
    print(f"  SDK scheduler: mean {result.mean_per_sec:.1f} polls/s, busiest second {result.peak_per_sec} "
          f"(t={result.peak_second} s), ratio {result.peak_per_sec / result.mean_per_sec:.2f} (goal ≤ 2)")
    print(f"  reference, Retry-After obeyed exactly: mean {result.exact_mean_per_sec:.1f} polls/s, busiest second "
          f"{result.exact_peak_per_sec}, ratio {result.exact_peak_per_sec / result.exact_mean_per_sec:.2f}")


if __name__ == "__main__":
    main()
