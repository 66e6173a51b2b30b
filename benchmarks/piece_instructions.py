"""Instructions one piece of a cache hit costs, alone, counted by callgrind (attribution for benchmarks/RESULTS.md).

`metrics`: what a hit records (its request in three metrics, the status cache's counter);
`request`: the request object a hit is given, and two header lookups (one header absent).
Pieces of the uncached list call: `policy` (the list route's timeout, retry and breaker around a
handler that answers at once), `list_query` (its query parsed, checked and encoded), `head` (the
upstream request's head with the 8 headers a list call sends), `sign` (one download link's HMAC).
Run under callgrind with N and 5N calls, from a checkout on PYTHONPATH; the difference over
4N is one call:

    PYTHONPATH=DIR valgrind --tool=callgrind python -m benchmarks.piece_instructions metrics 2000
"""
from __future__ import annotations

import sys
from typing import Any, Callable


def list_piece(name: str) -> Callable[[], None]:
    """A piece of the uncached list call."""
    if name == "list_query":
        from urllib.parse import parse_qsl

        from exports_common.list_query import check_list_query

        def check() -> None:
            check_list_query(parse_qsl("limit=1", keep_blank_values=True)).encode()

        return check
    if name == "head":
        from gateway.http_client import _head

        headers = [("x-forwarded-for", "127.0.0.1"), ("x-request-id", "0123456789abcdef0123456789abcdef"),
                   ("x-forwarded-proto", "http"), ("x-forwarded-host", "gw"), ("x-gateway-attempt", "1"),
                   ("x-tenant-id", "demo"), ("traceparent", f"00-{'1' * 32}-{'2' * 16}-00"),
                   ("authorization", "Bearer service-token-0123456789")]
        def head() -> None:
            _head("GET", "/exports?limit=1", "127.0.0.1:8081", headers, None)

        return head
    if name == "sign":
        from exports_common.signing import DownloadSigner

        signer = DownloadSigner(["dev-signing-secret-change-me"])
        def sign() -> None:
            signer.sign("exp-20261202-wwikejwi9j70r7ig7dmc", 1764900000)

        return sign
    return policy_piece()


def policy_piece() -> Callable[[], None]:
    """The list route's upstream call around a handler that answers at once, driven without an event loop."""
    import tempfile
    from pathlib import Path

    from gateway.plugins.base import RouteInfo
    from gateway.policy import RoutePolicy, upstream_call
    from gateway.policy.circuit_breaker import BreakerUse, CircuitBreakerSettings
    from gateway.response import GatewayResponse
    from tests.test_plugin_units import context, services

    answer = GatewayResponse(200)

    async def proxy(_: Any) -> GatewayResponse:
        return answer

    policy = RoutePolicy.model_validate({"timeout": {"connect": 2, "read": 10, "total": 15}, "retry": {"attempts": 3}})
    call = upstream_call(proxy, policy, BreakerUse("exports", CircuitBreakerSettings()),
                         services(Path(tempfile.mkdtemp())), RouteInfo("list", "exports", ("GET",), proxy))
    ctx = context("GET")
    ctx.tenant = "demo"

    def once() -> None:
        try:
            call(ctx).send(None)  # type: ignore[attr-defined]
        except StopIteration:
            pass

    return once


def piece(name: str) -> Callable[[], None]:
    if name in ("policy", "list_query", "head", "sign"):
        return list_piece(name)
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
