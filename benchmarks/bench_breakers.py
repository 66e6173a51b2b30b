"""A proxied call's circuit breakers on the common path (both closed, the answer a success): the gateway's
(`gateway/breakers.py`, the upstream's breaker and the tenant's) against purgatory's asyncio breakers used the same
way (one per upstream, one per tenant, nested).

A child process under `valgrind --tool=callgrind` makes N calls and 0 calls through each; the difference over N is one
call's instructions, the call itself (an awaited coroutine answering 200) included alike. What purgatory does not
hold (the per-tenant verdict on a failure status: which breaker it counts against) would be the gateway's on top of
it either way, and is not on this path.

`--half-open` counts instead what each lets through while half-open: both breakers opened by a
failure, the reset time passed, then N concurrent calls that each take 50 ms. The gateway's
half-open is one trial call; the others are refused until it answers.

    python -m benchmarks.bench_breakers [--calls 5000] [--half-open 20]
    (pip install -e '.[bench]': purgatory, pybreaker)
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any, cast

from benchmarks.callgrind import per_operation
from gateway.breakers import Breaker, guarded
from gateway.response import GatewayResponse
from gateway.telemetry import Metrics
from gateway.upstream import UpstreamError

FAILURES = frozenset({502, 503, 504})
IMPLEMENTATIONS = ("gateway", "purgatory")
ANSWER = GatewayResponse(200)
RESET_SEC = 0.05


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


async def trials_gateway(callers: int) -> int:
    """How many of `callers` concurrent calls reach the upstream while the gateway's breakers are half-open."""
    shared = Breaker("exports", 1, RESET_SEC, Metrics())
    reached = 0

    async def refused() -> GatewayResponse:
        raise UpstreamError("connect_error", "refused")

    async def slow() -> GatewayResponse:
        nonlocal reached
        reached += 1
        await asyncio.sleep(0.05)
        return ANSWER

    with contextlib.suppress(UpstreamError):
        await guarded(shared, refused, FAILURES, "demo")
    await asyncio.sleep(2 * RESET_SEC)
    await asyncio.gather(*(guarded(shared, slow, FAILURES, "demo") for _ in range(callers)), return_exceptions=True)
    return reached


async def trials_purgatory(callers: int) -> int:
    """The same through purgatory's breakers (one per upstream, one per tenant, nested)."""
    from purgatory import AsyncCircuitBreakerFactory

    factory: Any = AsyncCircuitBreakerFactory(default_threshold=1, default_ttl=RESET_SEC)
    shared = await factory.get_breaker("exports")
    own = await factory.get_breaker("exports/demo")
    reached = 0

    async def slow() -> None:
        nonlocal reached
        async with shared, own:
            reached += 1
            await asyncio.sleep(0.05)

    with contextlib.suppress(ConnectionError):
        async with shared, own:
            raise ConnectionError("refused")
    await asyncio.sleep(2 * RESET_SEC)
    await asyncio.gather(*(slow() for _ in range(callers)), return_exceptions=True)
    return reached


async def trials_pybreaker(callers: int) -> int:
    """The same through pybreaker's breakers, each call inside `calling()` (its context-manager form)."""
    import pybreaker

    shared = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=RESET_SEC)
    own = pybreaker.CircuitBreaker(fail_max=1, reset_timeout=RESET_SEC)
    reached = 0

    async def slow() -> None:
        nonlocal reached
        with shared.calling(), own.calling():
            reached += 1
            await asyncio.sleep(0.05)

    with contextlib.suppress(ConnectionError, pybreaker.CircuitBreakerError), shared.calling(), own.calling():
        raise ConnectionError("refused")
    await asyncio.sleep(2 * RESET_SEC)
    await asyncio.gather(*(slow() for _ in range(callers)), return_exceptions=True)
    return reached


def run(name: str, calls: int) -> None:
    """The child: `calls` calls through `name`'s breakers."""
    print(asyncio.run(through_gateway(calls) if name == "gateway" else through_purgatory(calls)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--half-open", type=int, metavar="CALLERS",
                        help="count the calls let through while half-open instead")
    parser.add_argument("--child", nargs=2, metavar=("BREAKERS", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], int(args.child[1]))
        return
    if args.half_open:
        for name, trials in (("gateway", trials_gateway), ("purgatory", trials_purgatory),
                             ("pybreaker", trials_pybreaker)):
            print(f"{name}: {asyncio.run(trials(args.half_open))} of {args.half_open} concurrent calls reached "
                  "the upstream while half-open (one trial is the breaker's rule)")
        return
    counted = {name: per_operation("benchmarks.bench_breakers", [name], args.calls) for name in IMPLEMENTATIONS}
    for name, count in counted.items():
        print(f"{name}: {count:,.0f} instructions per call ({count / counted['gateway']:.2f}x the gateway's)")


if __name__ == "__main__":
    main()
