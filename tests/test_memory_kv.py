"""The in-memory key-value store (`gateway/kv.py`'s MemoryKV): its bound, its eviction order and each entry's expiry.

The store is what the status cache and stale_if_error use without Redis; it holds entries in this process only.
Expiry is shown with a ttl already past (0 or negative) and with a short one waited out against a deadline.
"""
from __future__ import annotations

import time

import pytest

from gateway.kv import MemoryKV

pytestmark = pytest.mark.inprocess  # starts no server: `make test-fast` runs it


async def test_a_live_entry_reads_back_at_once_and_awaited() -> None:
    kv = MemoryKV()
    await kv.set("a", b"1", 60)
    assert kv.get_now is not None
    assert kv.get_now("a") == b"1"
    assert await kv.get("a") == b"1"
    assert kv.get_now("absent") is None
    assert await kv.get("absent") is None


async def test_an_entry_expires_after_its_own_ttl() -> None:
    kv = MemoryKV()
    await kv.set("short", b"1", 0.05)
    await kv.set("long", b"2", 60)
    deadline = time.monotonic() + 5
    while await kv.get("short") is not None:
        assert time.monotonic() < deadline, "an entry with a 50 ms ttl still read back after 5 s"
    assert await kv.get("long") == b"2"
    assert kv.size() == 1  # the expired entry read is gone


async def test_the_bound_drops_the_oldest_write_first() -> None:
    kv = MemoryKV(max_items=3)
    for key in ("a", "b", "c"):
        await kv.set(key, key.encode(), 60)
    await kv.set("a", b"a2", 60)  # a rewrite makes "a" the newest write
    assert kv.get_now is not None
    assert kv.get_now("b") == b"b"  # a read does not: "b" stays the oldest
    await kv.set("d", b"d", 60)
    assert kv.size() == 3
    assert [await kv.get(key) for key in ("a", "b", "c", "d")] == [b"a2", None, b"c", b"d"]


async def test_add_sets_only_an_absent_or_expired_key() -> None:
    kv = MemoryKV()
    assert await kv.add("k", b"first", 60)
    assert not await kv.add("k", b"second", 60)
    assert await kv.get("k") == b"first"
    await kv.set("gone", b"old", 0)
    assert await kv.add("gone", b"new", 60)
    assert await kv.get("gone") == b"new"


async def test_replace_writes_only_over_the_expected_live_value() -> None:
    kv = MemoryKV()
    assert not await kv.replace("k", b"v1", b"v2", 60)  # absent
    await kv.set("k", b"v1", 60)
    assert not await kv.replace("k", b"other", b"v2", 60)
    assert await kv.replace("k", b"v1", b"v2", 60)
    assert await kv.get("k") == b"v2"
    await kv.set("k", b"v2", -1)
    assert not await kv.replace("k", b"v2", b"v3", 60)  # expired
    assert await kv.get("k") is None


async def test_delete_removes_a_key_and_ignores_an_absent_one() -> None:
    kv = MemoryKV()
    await kv.set("k", b"v", 60)
    await kv.delete("k")
    await kv.delete("never")
    assert await kv.get("k") is None
    assert kv.size() == 0


async def test_reserve_counts_live_members_up_to_the_cap() -> None:
    kv = MemoryKV()
    assert await kv.reserve("idx", "m1", 60, cap=2)
    assert await kv.reserve("idx", "m2", 60, cap=2)
    assert not await kv.reserve("idx", "m3", 60, cap=2)
    assert await kv.reserve("idx", "m1", 60, cap=2)  # a member already counted is renewed, not refused
    assert await kv.reserve("other", "m3", 60, cap=2)  # each index has its own cap
    short = MemoryKV()
    assert await short.reserve("idx", "old", 0, cap=1)
    assert await short.reserve("idx", "new", 60, cap=1)  # the expired member no longer counts
