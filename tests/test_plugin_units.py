"""The plugins in one process, beside the real-process tests: a small chain built in-process, a fake upstream.

Each test builds the plugins as the chain builder does (`build_chain`, or one plugin
around a scripted `next`) and drives a RequestContext through them: fast, and each
plugin's own rule is checked on its own. Timing, sockets and real stores are the
real-process tests' job.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest
from pydantic import ValidationError

from exports_common.otel import TracingConfig
from exports_common.signing import DownloadSigner
from gateway import telemetry
from gateway.breakers import Breakers
from gateway.config import RouteConfig
from gateway.context import RequestContext
from gateway.limiter import Limiter
from gateway.plugins import PLUGINS
from gateway.plugins.base import Plugin, RouteInfo
from gateway.plugins.circuit_breaker import CircuitBreaker
from gateway.plugins.retry import Retry
from gateway.plugins.timeout import Timeout
from gateway.proxy import Proxy
from gateway.request import GatewayRequest
from gateway.response import GatewayResponse
from gateway.runtime import build_chain
from gateway.services import Services, State
from gateway.services import Upstream as ServiceUpstream
from gateway.tenants import TenantDirectory
from gateway.upstream import Body, EndpointPool, OutlierPolicy, Timeouts, UpstreamError

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

Upstream = Callable[[RequestContext], Awaitable[GatewayResponse]]
ROUTE = {"name": "submit", "path": "/s", "methods": ["POST"], "upstream": "exports"}


class Unreachable:
    """The upstream client of these tests: the scripted upstreams stand in front of the proxy."""

    async def request(self, method: str, url: str, headers: list[tuple[str, str]], body: Body,
                      timeouts: Timeouts) -> GatewayResponse:
        raise UpstreamError("connect_error", "no upstream in an in-process test")

    async def close(self) -> None:
        return None


def services(tmp_path: Path) -> Services:
    metrics, tracing = telemetry.setup("gateway", TracingConfig())
    return Services(client=Unreachable(), metrics=metrics, tracing=tracing, tenants=TenantDirectory({}),
                    signer=DownloadSigner(["s" * 16]), upstreams={}, state=State(None, "gw", str(tmp_path)),
                    breakers=Breakers(metrics), limiter=Limiter(None, "gw"))


def context(method: str = "GET", body: bytes = b"", params: dict[str, str] | None = None,
            **fields: Any) -> RequestContext:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": "/s", "headers": [], "query_string": b""}
    return RequestContext(request=GatewayRequest(scope, receive), method=method, route_name="submit",
                          upstream="exports", upstream_path="/s", params=params or {}, request_id="r", **fields)


def plugin(name: str, settings: dict[str, Any], upstream: Upstream, svc: Services) -> Plugin:
    cls = PLUGINS[name]
    route = RouteInfo("submit", "exports", ("POST",), upstream)
    return cls(upstream, cls.Settings.model_validate(settings), svc, route)


class Scripted:
    """An upstream that answers from a script: an UpstreamError kind raises it, a status answers with it."""

    def __init__(self, *script: str | int) -> None:
        self.script = list(script)
        self.calls: list[RequestContext] = []
        self.attempts: list[int] = []  # the context's attempt as each call saw it

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        self.calls.append(ctx)
        self.attempts.append(ctx.attempt)
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, str):
            raise UpstreamError(step, "scripted")  # type: ignore[arg-type]
        return GatewayResponse.envelope({"status": "COMPLETED", "task_id": "t"}, status=step)


RETRY = {"attempts": 3, "backoff": {"initial": 0, "max": 0}}


def test_retry_tries_a_write_again_only_when_it_carries_a_task_id(tmp_path: Path) -> None:
    svc = services(tmp_path)
    with_id = Scripted("connect_error", "connect_error", 200)
    resp = asyncio.run(plugin("retry", RETRY, with_id, svc)(context("POST", b"{}", task_id="exp_1")))
    assert resp.status == 200 and len(with_id.calls) == 3
    assert with_id.attempts == [1, 2, 3] and with_id.calls[-1].retry_reason == "connect_error"
    without = Scripted("connect_error", 200)
    with pytest.raises(UpstreamError):
        asyncio.run(plugin("retry", RETRY, without, svc)(context("POST", b"{}")))
    assert len(without.calls) == 1  # a header set by some plugin no longer decides: the typed field does


def test_the_body_is_read_once_whichever_plugin_asks_first(tmp_path: Path) -> None:
    ctx = context("POST", b'{"export_type": "x"}')
    assert asyncio.run(ctx.read_body(100)) == b'{"export_type": "x"}'
    assert asyncio.run(ctx.read_body(100)) == ctx.body  # the stream is gone; the kept bytes answer
    with pytest.raises(Exception, match="at most 5 bytes"):
        asyncio.run(ctx.read_body(5))


def test_status_cache_answers_a_terminal_status_from_its_store(tmp_path: Path) -> None:
    svc = services(tmp_path)
    upstream = Scripted(200)
    cache = plugin("status_cache", {}, upstream, svc)

    async def twice() -> list[str | None]:
        first, second = await cache(context(tenant="a")), await cache(context(tenant="a"))
        return [first.header("x-cache"), second.header("x-cache")]

    assert asyncio.run(twice()) == ["MISS", "HIT"] and len(upstream.calls) == 1
    stats = asyncio.run(PLUGINS["status_cache"].stats(svc))
    assert stats["status_cache"]["hits"] == 1 and stats["status_cache"]["misses"] == 1


def test_the_upstream_policy_wraps_the_proxy_in_a_fixed_order_and_serves_rerun_too(tmp_path: Path) -> None:
    svc = services(tmp_path)
    svc.upstreams = {"exports": _upstream()}
    # listed out of order and with a filter after them: the policy still sits innermost, timeout outermost
    route = RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": [
        "auth", {"circuit_breaker": {}}, {"retry": {}}, {"timeout": {}}, {"task_id": {"action": "check"}},
        {"rerun": {}}]})
    chain = build_chain(route, svc)
    seen = []
    handler: Any = chain
    while hasattr(handler, "next"):
        seen.append(type(handler).__name__)
        if type(handler).__name__ == "Rerun":
            assert isinstance(handler.call_upstream, Timeout)  # its own call goes through the whole policy
        handler = handler.next
    assert seen == ["Auth", "TaskId", "Rerun", "Timeout", "Retry", "CircuitBreaker"] and isinstance(handler, Proxy)


def _upstream() -> Any:
    return ServiceUpstream("exports", EndpointPool(["http://127.0.0.1:9"], "round_robin", OutlierPolicy(3, 1, 2)),
                           Timeouts(connect=1, read=1))


@pytest.mark.parametrize("plugins, problem", [
    (["auth", "validate", {"retry": {}}], "route `submit`: retry needs `task_id`, which no earlier plugin provides"),
    (["validate", {"task_id": {"action": "generate"}}, "outbox"],
     "route `submit`: outbox needs `tenant`, which no earlier plugin provides"),
    (["auth", {"task_id": {"action": "generate"}}, "outbox"],
     "route `submit`: outbox needs `body`, which no earlier plugin provides"),
    (["auth", {"task_id": {"action": "generate"}}, "idempotency"],
     "route `submit`: idempotency sets `task_id`, so it must come before task_id"),
    (["auth", "status_cache"], None),  # a write route: nothing is cached, but the tenant is there
])
def test_each_route_is_checked_against_the_plugins_declared_contracts(plugins: list[Any], problem: str | None) -> None:
    if problem is None:
        RouteConfig.model_validate({**ROUTE, "plugins": plugins})
        return
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate({**ROUTE, "plugins": plugins})
    assert problem in str(err.value)


def test_a_get_route_may_retry_without_a_task_id() -> None:
    RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": ["auth", {"retry": {}}]})


def test_plugin_state_and_metrics_are_one_per_process_across_reloads(tmp_path: Path) -> None:
    svc = services(tmp_path)
    assert svc.state.kv("cache") is svc.state.kv("cache") and svc.state.kv("cache") is not svc.state.kv("seen")
    tally = svc.metrics.tally("gateway_x", ("route",), "x")
    assert svc.metrics.tally("gateway_x", ("route",), "x") is tally
    with pytest.raises(ValueError, match="already counted"):
        svc.metrics.tally("gateway_x", ("other",), "x")


def test_stats_are_each_plugins_own_part(tmp_path: Path) -> None:
    svc = services(tmp_path)
    parts: dict[str, Any] = {}
    for cls in PLUGINS.values():
        parts.update(asyncio.run(cls.stats(svc)))
    assert {"status_cache", "idempotency_keys", "outbox", "retry_budget"} <= parts.keys()
    assert parts["outbox"]["pending"] == 0
    assert json.dumps(parts)  # what /admin/stats sends


def test_policy_plugins_know_their_rank() -> None:
    assert Timeout.upstream_policy < Retry.upstream_policy < CircuitBreaker.upstream_policy
    assert not PLUGINS["auth"].upstream_policy


def test_rerun_asks_through_the_routes_upstream_call_and_answers_the_task_as_it_now_is(tmp_path: Path) -> None:
    svc = services(tmp_path)
    timed_out = {"task_id": "t", "status": "TIMEOUT", "attempt": 1, "reruns": 0}
    asked: list[tuple[str, str, bytes | None, dict[str, str]]] = []

    async def status(ctx: RequestContext) -> GatewayResponse:
        return GatewayResponse.envelope(timed_out)

    async def upstream(ctx: RequestContext) -> GatewayResponse:
        asked.append((ctx.method, ctx.upstream_path, ctx.body, dict(ctx.upstream_headers)))
        return GatewayResponse.envelope({**timed_out, "status": "PENDING", "attempt": 2, "reruns": 1})

    rerun = PLUGINS["rerun"](status, PLUGINS["rerun"].Settings(), svc,
                             RouteInfo("status", "exports", ("GET",), upstream))
    ctx = context(params={"task_id": "t"}, upstream_headers={"x-tenant-id": "a"})
    resp = asyncio.run(rerun(ctx))
    assert resp.status == 200 and resp.header("retry-after") == "1"
    [(method, path, body, headers)] = asked
    assert (method, path) == ("POST", "/exports/t/retry") and json.loads(body or b"")["expected_attempt"] == 1
    assert headers == {"x-tenant-id": "a", "content-type": "application/json"}
    assert ctx.method == "GET" and ctx.body is None  # the client's request is left as it was


def test_a_contract_naming_no_context_field_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PLUGINS["auth"], "provides", frozenset({"tenant_id"}))  # a typo a plugin author might make
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": ["auth"]})
    assert "route `submit`: auth declares `tenant_id`, which is not a field of the request context" in str(err.value)
