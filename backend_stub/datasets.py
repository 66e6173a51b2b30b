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
PRIORITIES = ["low", "normal", "high", "urgent"]
# free text as customers write it: quotes, commas, line breaks, Unicode, and openings a spreadsheet would
# run as a formula (what csv_escape_formulas is for)
SUBJECTS = [
    "Refund not received", 'Invoice "INV-7" shows the wrong total', "Cannot log in, reset link expired",
    "Line one\nline two", "Ünïcödé ✓ 日本語 in the address", " leading space kept",
    "=HYPERLINK(\"http://evil.example\",\"details\")", "+1 same problem here", "-5 stars, app crashes",
    "@support please call back",
]
NOTES = ["", "", "", "called back", "escalated to billing"]


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


def _tickets(seed: int, rows: int) -> Iterator[Row]:
    """Support tickets: an open ticket has no closing day (NULL); most notes are empty strings, not NULL."""
    r = random.Random(seed).random
    for i in range(1, rows + 1):
        opened = int(r() * 700)
        closed = DAYS[opened + int(r() * 30)] if r() < 0.7 else None
        yield (i, DAYS[opened], closed, PRIORITIES[int(r() * 4)], SUBJECTS[int(r() * len(SUBJECTS))],
               NOTES[int(r() * len(NOTES))])


DATASETS: dict[str, Dataset] = {
    "orders": Dataset(("order_id", "user_id", "status", "region", "amount", "created_at"), _orders),
    "users": Dataset(("user_id", "name", "email", "country", "plan", "signup_date"), _users),
    "report": Dataset(("day", "region", "metric", "value"), _report),
    "tickets": Dataset(("ticket_id", "opened_on", "closed_on", "priority", "subject", "note"), _tickets),
}
