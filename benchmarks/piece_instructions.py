"""Instructions one piece of a cache hit costs, alone, counted by callgrind (attribution for benchmarks/RESULTS.md).

`metrics`: what a hit records (its request in three metrics, the status cache's counter);
`request`: the request object a hit is given, and two header lookups (one header absent).
Run under callgrind with N and 5N calls, from a checkout on PYTHONPATH; the difference over
4N is one call:

    PYTHONPATH=DIR valgrind --tool=callgrind python -m benchmarks.piece_instructions metrics 2000
"""
from __future__ import annotations

import sys
from typing import Any, Callable


def piece(name: str) -> Callable[[], None]:
    if name == "metrics":
        from gateway.telemetry import Metrics

        metrics = Metrics()
        tally = metrics.tally("gateway_status_cache", ("route", "result"), "status cache lookups")

        def record() -> None:
            metrics.requests.record(0.002, "status", "GET", "/api/v1/exports/{task_id}", 200)
            tally.add("status", "hit")

        return record
    from starlette.requests import Request

    made: Any = Request
    try:  # an earlier checkout's own request class, where it has one
        from gateway.request import GatewayRequest  # type: ignore[import-not-found, unused-ignore]

        made = GatewayRequest
    except ImportError:
        pass
    scope = {"type": "http", "method": "GET", "path": "/p", "query_string": b"",
             "headers": [(b"host", b"gw"), (b"authorization", b"Bearer k")]}

    async def receive() -> dict[str, Any]:
        return {}

    def read() -> None:
        headers = made(scope, receive).headers
        headers.get("x-request-id")
        headers.get("authorization")

    return read


def main() -> None:
    one = piece(sys.argv[1])
    for _ in range(10 + int(sys.argv[2])):
        one()


if __name__ == "__main__":
    main()
