"""Deterministic synthetic data sets: any number of rows, generated from a seed, never stored.

The same (seed, rows) always yields the same rows, so a test can recompute what an
export must contain.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Callable, Iterator

Row = tuple
_EPOCH = date(2025, 1, 1)
DAYS = [(_EPOCH + timedelta(days=i)).isoformat() for i in range(730)]
REGIONS = ["us-east", "us-west", "eu-west", "eu-central", "ap-south", "ap-east"]
ORDER_STATUSES = ["paid", "shipped", "refunded", "cancelled"]
COUNTRIES = ["US", "DE", "FR", "JP", "IN", "BR", "CN", "GB"]
PLANS = ["free", "pro", "team", "enterprise"]
METRICS = ["revenue", "orders", "visits", "signups"]


@dataclass(frozen=True)
class Dataset:
    columns: tuple[str, ...]
    generate: Callable[[int, int], Iterator[Row]]


def _orders(seed: int, rows: int) -> Iterator[Row]:
    r = random.Random(seed).random
    for i in range(1, rows + 1):
        yield (
            i,
            1 + int(r() * 50_000),
            ORDER_STATUSES[int(r() * 4)],
            REGIONS[int(r() * 6)],
            round(r() * 1000, 2),
            DAYS[int(r() * 730)],
        )


def _users(seed: int, rows: int) -> Iterator[Row]:
    r = random.Random(seed).random
    for i in range(1, rows + 1):
        yield (i, f"user{i}", f"user{i}@example.com",
               COUNTRIES[int(r() * 8)], PLANS[int(r() * 4)], DAYS[int(r() * 730)])


def _report(seed: int, rows: int) -> Iterator[Row]:
    r = random.Random(seed).random
    for i in range(rows):
        yield (DAYS[i % 730], REGIONS[(i // 730) % 6], METRICS[int(r() * 4)], round(r() * 10_000, 2))


DATASETS: dict[str, Dataset] = {
    "orders": Dataset(("order_id", "user_id", "status", "region", "amount", "created_at"), _orders),
    "users": Dataset(("user_id", "name", "email", "country", "plan", "signup_date"), _users),
    "report": Dataset(("day", "region", "metric", "value"), _report),
}
