"""A status-cache hit's read of the in-memory store: `gateway/kv.py`'s MemoryKV against cachetools' TLRUCache.

The status cache without Redis reads its entry with `MemoryKV.get_now` on every hit. Here each store holds 1,000
entries with a ttl, and a child process under `valgrind --tool=callgrind` reads one live entry N times and 0 times;
the difference over N is one read's instructions. cachetools' TLRUCache gives what MemoryKV does (a bound, and an
expiry per entry) with its ttu reading the entry's own ttl.

    python -m benchmarks.bench_memory_kv [--reads 20000]    (pip install -e '.[bench]': cachetools)
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, Callable

from benchmarks.callgrind import instructions
from gateway.kv import MemoryKV

ENTRIES = 1000
TTL_SEC = 3600.0
STORES = ("MemoryKV", "cachetools")


def reader(name: str) -> Callable[[str], bytes | None]:
    """`get_now` of a store of ENTRIES live entries."""
    if name == "MemoryKV":
        kv = MemoryKV(max_items=100_000)
        for i in range(ENTRIES):
            asyncio.run(kv.set(f"t:exp_{i}", b"x" * 300, TTL_SEC))
        assert kv.get_now is not None
        return kv.get_now
    from cachetools import TLRUCache

    def until(key: str, value: tuple[float, bytes], now: float) -> float:
        return now + value[0]

    cache: Any = TLRUCache(maxsize=100_000, ttu=until, timer=time.monotonic)
    for i in range(ENTRIES):
        cache[f"t:exp_{i}"] = (TTL_SEC, b"x" * 300)

    def get_now(key: str) -> bytes | None:
        item = cache.get(key)
        return None if item is None else item[1]

    return get_now


def read(name: str, reads: int) -> None:
    """The child: `reads` reads of one live entry."""
    get_now = reader(name)
    found = 0
    for _ in range(reads):
        found += get_now("t:exp_500") is not None
    print(found)


def per_read(name: str, reads: int) -> float:
    argv = [sys.executable, "-m", "benchmarks.bench_memory_kv", "--child", name]
    return (instructions([*argv, str(reads)], {}) - instructions([*argv, "0"], {})) / reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--child", nargs=2, metavar=("STORE", "READS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        read(args.child[0], int(args.child[1]))
        return
    counted = {name: per_read(name, args.reads) for name in STORES}
    for name, count in counted.items():
        print(f"{name}: {count:,.0f} instructions per read ({count / counted['MemoryKV']:.2f}x MemoryKV)")


if __name__ == "__main__":
    main()
