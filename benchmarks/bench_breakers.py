"""A proxied call's circuit breakers on the common path (both closed, the answer a success): the gateway's
(`gateway/breakers.py`, the upstream's breaker and the tenant's) against purgatory's asyncio breakers used the same
way (one per upstream, one per tenant, nested).

A child process under `valgrind --tool=callgrind` makes N calls and 0 calls through each; the difference over N is one
call's instructions, the call itself (an awaited coroutine answering 200) included alike. What purgatory does not
hold (the per-tenant verdict on a failure status: which breaker it counts against) would be the gateway's on top of
it either way, and is not on this path.

    python -m benchmarks.bench_breakers [--calls 5000]    (pip install -e '.[bench]': purgatory)
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, cast

from benchmarks.callgrind import instructions
from gateway.breakers import Breaker, guarded
from gateway.response import GatewayResponse
from gateway.telemetry import Metrics

FAILURES = frozenset({502, 503, 504})
IMPLEMENTATIONS = ("gateway", "purgatory")
ANSWER = GatewayResponse(200)


async def call() -> GatewayResponse:
    return ANSWER


async def through_gateway(calls: int) -> int:
    shared = Breaker("exports", 5, 10.0, cast(Metrics, None))  # metrics are touched only on a state change
    ok = 0
    for _ in range(calls):
        ok += (await guarded(shared, call, FAILURES, "demo")).status == 200
    return ok


async def through_purgatory(calls: int) -> int:
    from purgatory import AsyncCircuitBreakerFactory

    factory: Any = AsyncCircuitBreakerFactory(default_threshold=5, default_ttl=10.0)
    shared = await factory.get_breaker("exports")
    own = await factory.get_breaker("exports/demo")
    ok = 0
    for _ in range(calls):
        async with shared, own:
            ok += (await call()).status == 200
    return ok


def run(name: str, calls: int) -> None:
    """The child: `calls` calls through `name`'s breakers."""
    print(asyncio.run(through_gateway(calls) if name == "gateway" else through_purgatory(calls)))


def per_call(name: str, calls: int) -> float:
    argv = [sys.executable, "-m", "benchmarks.bench_breakers", "--child", name]
    return (instructions([*argv, str(calls)], {}) - instructions([*argv, "0"], {})) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--child", nargs=2, metavar=("BREAKERS", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], int(args.child[1]))
        return
    counted = {name: per_call(name, args.calls) for name in IMPLEMENTATIONS}
    for name, count in counted.items():
        print(f"{name}: {count:,.0f} instructions per call ({count / counted['gateway']:.2f}x the gateway's)")


if __name__ == "__main__":
    main()
