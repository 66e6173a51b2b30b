"""A status-cache hit's read of the in-memory store: `gateway/kv.py`'s MemoryKV against the ways to build it.

The status cache without Redis reads its entry with `MemoryKV.get_now` on every hit; stale_if_error writes one on
every 200. Here each store holds 1,000 entries with a ttl, and a child process under `valgrind --tool=callgrind`
does one operation N times and 0 times; the difference over N is one operation's instructions. The stores:

- `hand-written`: the store as it was written by hand (an OrderedDict of `(expires_at, value)`), the reference;
- `MemoryKV`: the gateway's store, cachetools' `FIFOCache` of `(expires_at, value)`, the expiry checked on read;
- `TLRUCache.get`, `TLRUCache[key]`: cachetools' per-entry expiry (a ttu reading the entry's own ttl);
- `LRUCache[key]`: an LRU bound instead of oldest-write-out-first, the expiry checked on read as MemoryKV does.

`read` is a live entry's read (a hit), `miss` an absent key's, `write` an overwrite of a live
entry, awaited as the plugins do (every store's write is a coroutine, as the key-value layer's are).

    python -m benchmarks.bench_memory_kv [--ops 20000] [--op read|miss|write|all]
"""
from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from typing import Any, Callable, Coroutine

from cachetools import LRUCache, TLRUCache

from benchmarks.callgrind import per_operation
from gateway.kv import MemoryKV

ENTRIES = 1000
MAX_ITEMS = 100_000
TTL_SEC = 3600.0
VALUE = b"x" * 300
OPS = ("read", "miss", "write")

Read = Callable[[str], bytes | None]
Write = Callable[[str, bytes, float], Coroutine[Any, Any, None]]


class HandWritten:
    """The in-memory store's read and write as they were before cachetools: the reference."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def get_now(self, key: str) -> bytes | None:
        item = self.items.get(key)
        if item is None:
            return None
        if item[0] <= time.monotonic():
            del self.items[key]
            return None
        return item[1]

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        self.items[key] = (time.monotonic() + ttl, value)
        self.items.move_to_end(key)
        while len(self.items) > self.max_items:
            self.items.popitem(last=False)


def hand_written() -> tuple[Read, Write]:
    store = HandWritten(MAX_ITEMS)
    return store.get_now, store.set


def memory_kv() -> tuple[Read, Write]:
    kv = MemoryKV(max_items=MAX_ITEMS)
    assert kv.get_now is not None

    return kv.get_now, kv.set


def _until(key: str, value: tuple[float, bytes], now: float) -> float:
    return now + value[0]


def tlru_get() -> tuple[Read, Write]:
    cache: Any = TLRUCache(maxsize=MAX_ITEMS, ttu=_until, timer=time.monotonic)

    def read(key: str) -> bytes | None:
        item = cache.get(key)
        return None if item is None else item[1]

    async def write(key: str, value: bytes, ttl: float) -> None:
        cache[key] = (ttl, value)

    return read, write


def tlru_item() -> tuple[Read, Write]:
    cache: Any = TLRUCache(maxsize=MAX_ITEMS, ttu=_until, timer=time.monotonic)

    def read(key: str) -> bytes | None:
        try:
            return cache[key][1]
        except KeyError:
            return None

    async def write(key: str, value: bytes, ttl: float) -> None:
        cache[key] = (ttl, value)

    return read, write


def lru_item() -> tuple[Read, Write]:
    cache: LRUCache[str, tuple[float, bytes]] = LRUCache(maxsize=MAX_ITEMS)

    def read(key: str) -> bytes | None:
        try:
            expires_at, value = cache[key]
        except KeyError:
            return None
        if expires_at <= time.monotonic():
            del cache[key]
            return None
        return value

    async def write(key: str, value: bytes, ttl: float) -> None:
        cache[key] = (time.monotonic() + ttl, value)

    return read, write


STORES: dict[str, Callable[[], tuple[Read, Write]]] = {
    "hand-written": hand_written,
    "MemoryKV": memory_kv,
    "TLRUCache.get": tlru_get,
    "TLRUCache[key]": tlru_item,
    "LRUCache[key]": lru_item,
}


def drive(write: Coroutine[Any, Any, None]) -> None:
    """A write as the gateway's plugins await it (the coroutine never suspends: no I/O)."""
    try:
        write.send(None)
    except StopIteration:
        return
    raise RuntimeError("an in-memory write suspended")


def run(name: str, op: str, n: int) -> None:
    """The child: `n` operations `op` on a store of ENTRIES live entries."""
    read, write = STORES[name]()
    for i in range(ENTRIES):
        drive(write(f"t:exp_{i}", VALUE, TTL_SEC))
    found = 0
    if op == "read":
        for _ in range(n):
            found += read("t:exp_500") is not None
    elif op == "miss":
        for _ in range(n):
            found += read("t:absent") is not None
    else:
        for _ in range(n):
            drive(write("t:exp_500", VALUE, TTL_SEC))
    print(found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--op", choices=[*OPS, "all"], default="all")
    parser.add_argument("--child", nargs=3, metavar=("STORE", "OP", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], args.child[1], int(args.child[2]))
        return
    for op in OPS if args.op == "all" else (args.op,):
        counted = {name: per_operation("benchmarks.bench_memory_kv", [name, op], args.ops) for name in STORES}
        for name, count in counted.items():
            print(f"{op:5} {name:15} {count:9,.0f} instructions ({count / counted['hand-written']:.2f}x hand-written)")


if __name__ == "__main__":
    main()
