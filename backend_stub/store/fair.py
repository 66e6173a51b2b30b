"""Fair turns among tenants for the work queue: stride scheduling with an optional running cap.

Both stores follow these rules (SQLite in `Turns` below, Redis in its claim script):
- every tenant with queued work has a pass; a claim serves, among the tenants under their running
  cap, the one with the lowest pass (equal passes: the lower tenant id), then advances that
  tenant's pass by STRIDE / weight: over time each busy tenant gets workers in proportion to its weight;
- the virtual time is the pass the last served tenant had; a tenant whose queue was empty joins at
  no less than it, so time spent idle earns no credit to burst with later;
- within a tenant, tasks run in the order they were queued;
- a lease that ran out (its worker died or stalled) is taken over before any new task: it already
  counts against its tenant's cap, and it is the oldest work.
A tenant at its cap is skipped, not waited for: the next tenant in line gets the worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from backend_stub.config import SchedulerConfig

# integer passes keep SQLite's and Redis's arithmetic identical (Lua numbers are doubles)
STRIDE = 1_000_000


@dataclass(frozen=True)
class Fairness:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)

    def stride(self, tenant: str) -> int:
        return STRIDE // self.config.weights.get(tenant, self.config.default_weight)

    def cap(self, tenant: str) -> int | None:
        return self.config.max_running.get(tenant, self.config.default_max_running)

    def script_args(self) -> list[str | int]:
        """The defaults, then (tenant, stride, cap) for every tenant with its own setting; cap 0 is none."""
        args: list[str | int] = [STRIDE // self.config.default_weight, self.config.default_max_running or 0]
        for tenant in sorted(set(self.config.weights) | set(self.config.max_running)):
            args += [tenant, self.stride(tenant), self.cap(tenant) or 0]
        return args


class Turns:
    """The scheduler's state for one process's queue (the SQLite store); soft: a restart starts it afresh."""

    def __init__(self, fairness: Fairness) -> None:
        self.fairness = fairness
        self.passes: dict[str, int] = {}
        self.vtime = 0

    def join(self, tenant: str) -> None:
        """The tenant's queue was empty and now has a task."""
        self.passes[tenant] = max(self.passes.get(tenant, 0), self.vtime)

    def pick(self, ready: list[str], running: dict[str, int]) -> str | None:
        """The tenant to serve next among those with queued tasks, or None if all are at their cap."""
        for tenant in sorted(ready, key=lambda t: (self.passes.get(t, self.vtime), t)):
            cap = self.fairness.cap(tenant)
            if cap is None or running.get(tenant, 0) < cap:
                return tenant
        return None

    def served(self, tenant: str) -> None:
        current = max(self.passes.get(tenant, self.vtime), self.vtime)
        self.vtime = current
        self.passes[tenant] = current + self.fairness.stride(tenant)
