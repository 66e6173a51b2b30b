"""How long to wait before trying again: what an answer's `Retry-After` asks, and a jittered exponential backoff.

Every retry loop of the server side takes its wait from here. The client SDK (exports_client/polling.py)
keeps its own: it is shipped alone and imports nothing of the server packages.
"""
from __future__ import annotations

import email.utils
import random
import time


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a `Retry-After` header (delay-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit() also takes other scripts' digits, '²'
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff(step: int, first: float, cap: float, multiplier: float = 2.0, full_jitter: bool = False) -> float:
    """The pause before retry number `step` + 1: drawn at random under a ceiling of `first` x `multiplier`**`step`
    (at most `cap`), from half the ceiling up (the pause still grows), or from 0 with `full_jitter` (spread
    widest). The randomness keeps callers that failed together from coming back together."""
    try:
        ceiling = min(cap, first * multiplier**step)
    except OverflowError:  # a long run of failures: far past the cap
        ceiling = cap
    return random.uniform(0.0 if full_jitter else ceiling / 2, ceiling)
