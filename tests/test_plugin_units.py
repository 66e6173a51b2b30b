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
from redis.exceptions import ConnectionError as RedisConnectionError

from exports_common.errors import ApiError, ErrorKind
from exports_common.otel import TracingConfig
from exports_common.signing import DownloadSigner
from exports_common.task_ids import new_task_id
from gateway import telemetry
from gateway.breakers import Breakers
from gateway.config import GatewayConfig, RouteConfig
from gateway.context import RequestContext, first_values
from gateway.limiter import Limiter, Quota
from gateway.plugins import PLUGINS
from gateway.plugins.base import Gatekeepers, Plugin, RouteInfo
from gateway.policy import stats as policy_stats
from gateway.policy.circuit_breaker import BreakerUse, CircuitBreakerSettings
from gateway.policy.retry import Retry, RetrySettings
from gateway.policy.timeout import Timeout
from gateway.proxy import Proxy
from gateway.refusal_hold import HoldSettings
from gateway.response import GatewayResponse, freeze
from gateway.runtime import build_chain
from gateway.services import Services, State
from gateway.services import Upstream as ServiceUpstream
from gateway.tenants import Limits, TenantDirectory, TenantLimits, hash_key
from gateway.upstream import Body, EndpointPool, OutlierPolicy, Timeouts, UpstreamError

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

Upstream = Callable[[RequestContext], Awaitable[GatewayResponse]]
ROUTE = {"name": "submit", "path": "/s", "methods": ["POST"], "upstream": "exports"}


class Unreachable:
    """The upstream client of these tests: the scripted upstreams stand in front of the proxy."""

    async def request(self, method: str, url: str, headers: list[tuple[str, str]], body: Body,
                      timeouts: Timeouts) -> GatewayResponse:
        raise UpstreamError("connect_error", "no upstream in an in-process test")

    def resize(self, pool_sizes: dict[str, int]) -> None:
        return None

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
    return RequestContext(scope=scope, receive=receive, header_values=first_values(scope), method=method,
                          route_name="submit", upstream="exports", upstream_path="/s", params=params or {},
                          request_id="r", **fields)


def plugin(name: str, settings: dict[str, Any], upstream: Upstream, svc: Services) -> Plugin:
    cls = PLUGINS[name]
    route = RouteInfo("submit", "exports", ("POST",), upstream)
    return cls(upstream, cls.Settings.model_validate(settings), svc, route)


def retry(settings: dict[str, Any], upstream: Upstream, svc: Services) -> Retry:
    return Retry(upstream, RetrySettings.model_validate(settings), svc, RouteInfo("submit", "exports", ("POST",),
                                                                                   upstream))


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
    resp = asyncio.run(retry(RETRY, with_id, svc)(context("POST", b"{}", task_id="exp_1")))
    assert resp.status == 200 and len(with_id.calls) == 3
    assert with_id.attempts == [1, 2, 3] and with_id.calls[-1].retry_reason == "connect_error"
    without = Scripted("connect_error", 200)
    with pytest.raises(UpstreamError):
        asyncio.run(retry(RETRY, without, svc)(context("POST", b"{}")))
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


def test_status_cache_a_hit_answers_the_bytes_its_store_holds_now(tmp_path: Path) -> None:
    """A hit's decoded answer serves only while the store returns the bytes it was decoded from: an entry written
    anew (another process's fill of a shared store) is answered as written; one hit's answer changed by a plugin
    does not change the next."""
    svc = services(tmp_path)
    cache: Any = plugin("status_cache", {}, Scripted(200), svc)
    key = "{a:t}"

    async def run() -> list[tuple[Any, ...]]:
        def poll() -> RequestContext:
            return context(tenant="a", params={"task_id": "t"})

        await cache(poll())  # the miss that fills the entry
        hit = await cache(poll())
        hit.set_header("x-changed", "1")
        again = await cache(poll())
        rewritten = GatewayResponse.envelope({"status": "FAILED", "task_id": "t"})
        await cache.store.set(key, freeze(rewritten, await rewritten.read()), 60)
        after = await cache(poll())
        return [(r.header("x-cache"), r.header("x-changed"), json.loads(r.body or b"")["data"]["status"])
                for r in (hit, again, after)]

    assert asyncio.run(run()) == [("HIT", "1", "COMPLETED"), ("HIT", None, "COMPLETED"), ("HIT", None, "FAILED")]


class HeldReads:
    """The cache's store read across an await, as Redis is: `hold` keeps each read's answer until `release`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.get_now = None
        self.hold = False
        self.release = asyncio.Event()

    async def get(self, key: str) -> bytes | None:
        raw = await self.inner.get(key)
        if self.hold:
            await self.release.wait()
        return raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_status_cache_a_miss_read_while_the_fill_ran_shares_its_answer(tmp_path: Path) -> None:
    """A poll whose store read missed before the fill was stored, and came back after it ended, found no call in
    flight any more: with a remote store, a storm of polls made several upstream calls per TTL that way."""
    svc = services(tmp_path)
    gate = asyncio.Event()
    calls: list[RequestContext] = []

    async def upstream(ctx: RequestContext) -> GatewayResponse:
        calls.append(ctx)
        await gate.wait()
        return GatewayResponse.envelope({"status": "COMPLETED", "task_id": "t"})

    cache: Any = plugin("status_cache", {}, upstream, svc)
    store = cache.store = HeldReads(cache.store)
    cache.get_now = None

    async def race() -> list[str | None]:
        leader = asyncio.create_task(cache(context(tenant="a", params={"task_id": "t"})))
        while not calls:
            await asyncio.sleep(0)
        store.hold = True
        follower = asyncio.create_task(cache(context(tenant="a", params={"task_id": "t"})))
        await asyncio.sleep(0.01)  # its read has missed and is held
        gate.set()
        first = await leader  # stored and out of flight
        store.release.set()
        second = await follower
        return [first.header("x-cache"), second.header("x-cache"), str(second.status)]

    assert asyncio.run(race()) == ["MISS", "MISS", "200"]
    assert len(calls) == 1, "the follower's miss must share the leader's answer, not call the upstream again"


class FailingWrites:
    """The cache's store with Redis failing on every write."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def set(self, key: str, value: bytes, ttl: float) -> None:
        raise RedisConnectionError("Redis went away")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_status_cache_answers_a_poll_whose_entry_cannot_be_written(tmp_path: Path) -> None:
    """The upstream answered: a cache that cannot keep it costs the next poll a call, not this one a 503."""
    svc = services(tmp_path)
    upstream = Scripted(200)
    cache: Any = plugin("status_cache", {}, upstream, svc)
    cache.store = FailingWrites(cache.store)

    async def twice() -> list[int]:
        return [(await cache(context(tenant="a"))).status for _ in range(2)]

    assert asyncio.run(twice()) == [200, 200] and len(upstream.calls) == 2


def test_plugins_run_as_listed_and_the_upstream_call_last_which_serves_rerun_too(tmp_path: Path) -> None:
    svc = services(tmp_path)
    svc.upstreams = {"exports": _upstream()}
    route = RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "policy": {"retry": {}, "timeout": {}},
                                        "plugins": ["auth", {"rerun": {}}, {"task_id": {"action": "check"}}]})
    chain = build_chain(route, BreakerUse("exports", CircuitBreakerSettings()), svc)
    seen = []
    handler: Any = chain
    while hasattr(handler, "next"):
        seen.append(type(handler).__name__)
        if type(handler).__name__ == "Rerun":
            assert isinstance(handler.call_upstream, Timeout)  # its own call goes through the whole policy
        handler = handler.next
    assert seen == ["Auth", "Rerun", "TaskId", "Timeout", "Retry", "CircuitBreaker"] and isinstance(handler, Proxy)


def test_a_routes_own_breaker_and_its_upstreams_open_apart(tmp_path: Path) -> None:
    """Two routes to one upstream: `api` shares the upstream's breaker, `download` has its own (scope: route)."""
    svc = services(tmp_path)
    config = GatewayConfig.model_validate({
        "admin_token": "x" * 8, "download_signing": {"secrets": ["s" * 16]},
        "upstreams": {"exports": {"url": "http://127.0.0.1:9", "circuit_breaker": {"fail_max": 2}}},
        "routes": [{**ROUTE, "name": "api", "methods": ["GET"]},
                   {**ROUTE, "name": "download", "methods": ["GET"],
                    "policy": {"circuit_breaker": {"scope": "route", "reset_timeout_sec": 60}}}]})
    api, download = config.routes
    # neither route has a tenant provider: the api route's callers are one anonymous tenant on the shared breaker,
    # the download route's 5xx count toward its own breaker directly
    assert config.breaker_of(api) == BreakerUse("exports", CircuitBreakerSettings(fail_max=2), "anonymous")
    assert config.breaker_of(download) == BreakerUse(
        "exports@download", CircuitBreakerSettings(fail_max=2, reset_timeout_sec=60), "breaker")
    failing = Scripted("connect_error")
    chains = {r.name: build_chain(r, config.breaker_of(r), svc, failing) for r in config.routes}

    async def outcome(route: str) -> str:
        try:
            return str((await chains[route](context())).status)
        except UpstreamError as exc:
            return exc.kind

    async def run() -> list[str]:
        return [await outcome(r) for r in ("api", "api", "api", "download", "download", "download", "api")]

    assert asyncio.run(run()) == ["connect_error", "connect_error", "circuit_open",  # the upstream's opens
                                  "connect_error", "connect_error", "circuit_open",  # the route's, on its own
                                  "circuit_open"]
    assert len(failing.calls) == 4
    assert set(svc.breakers.by_upstream) == {"exports", "exports@download"}


def _upstream() -> Any:
    return ServiceUpstream("exports", EndpointPool(["http://127.0.0.1:9"], "round_robin", OutlierPolicy(3, 1, 2)),
                           Timeouts(connect=1, read=1))


@pytest.mark.parametrize("plugins, at, problem", [
    (["validate", {"task_id": {"action": "generate"}}, "outbox"],
     ("plugins", 2, "outbox"), "route `submit`: outbox needs `tenant`, which no earlier plugin provides: list auth "
                               "before it"),
    (["auth", {"task_id": {"action": "generate"}}, "outbox"],
     ("plugins", 2, "outbox"), "route `submit`: outbox needs `body`, which no earlier plugin provides: list validate "
                               "before it"),
    (["auth", {"task_id": {"action": "generate"}}, "outbox", "validate"],  # the provider, listed too late
     ("plugins", 2, "outbox"), "route `submit`: outbox needs `body`, which validate provides, but validate is listed "
                               "after it: list validate before outbox"),
    (["auth", {"task_id": {"action": "generate"}}, "idempotency"],
     ("plugins", 2, "idempotency"), "route `submit`: idempotency sets `task_id`, so it must come before task_id, "
                                    "which sets one only when no earlier plugin did"),
    (["auth", "status_cache"], None, None),  # a write route: nothing is cached, but the tenant is there
])
def test_each_route_is_checked_against_the_plugins_declared_contracts(plugins: list[Any], at: tuple[Any, ...] | None,
                                                                      problem: str | None) -> None:
    if problem is None:
        assert RouteConfig.model_validate({**ROUTE, "plugins": plugins}).plugins[1].name == "status_cache"
        return
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate({**ROUTE, "plugins": plugins})
    found = [(error["loc"], error["msg"]) for error in err.value.errors()]
    # the outbox needs `json` beside `body` (both validate's): one problem for each, alike
    also = [(at, problem.replace("`body`", "`json`"))] if "outbox needs `body`" in problem else []
    assert found == [(at, problem), *also]


def test_a_write_route_retries_only_with_a_task_id_and_a_read_route_without_one() -> None:
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate({**ROUTE, "plugins": ["auth", "validate"], "policy": {"retry": {}}})
    [error] = err.value.errors()
    assert error["loc"] == ("policy", "retry")
    assert error["msg"] == ("route `submit`: policy.retry needs `task_id`, which no earlier plugin provides: list "
                            "idempotency or task_id before it")
    read = RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": ["auth"], "policy": {"retry": {}}})
    assert read.policy.retry is not None and read.policy.retry.attempts == 3


def test_a_plugin_that_answers_every_request_must_be_listed_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PLUGINS["fault"], "terminal_handler", True)  # as a handler plugin declares itself
    with pytest.raises(ValidationError) as err:
        RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": ["fault", "auth", "list_query"]})
    [error] = err.value.errors()
    assert error["loc"] == ("plugins", 0, "fault")
    assert error["msg"] == ("route `submit`: fault answers every request itself, so auth, list_query after it would "
                            "never run: list it last")
    assert RouteConfig.model_validate({**ROUTE, "methods": ["GET"], "plugins": ["auth", "fault"]}).plugins


def test_plugin_state_and_metrics_are_one_per_process_across_reloads(tmp_path: Path) -> None:
    svc = services(tmp_path)
    assert svc.state.kv("cache") is svc.state.kv("cache") and svc.state.kv("cache") is not svc.state.kv("seen")
    tally = svc.metrics.tally("gateway_x", ("route",), "x")
    assert svc.metrics.tally("gateway_x", ("route",), "x") is tally
    with pytest.raises(ValueError, match="already counted"):
        svc.metrics.tally("gateway_x", ("other",), "x")


def test_stats_are_each_plugins_own_part(tmp_path: Path) -> None:
    svc = services(tmp_path)
    parts: dict[str, Any] = policy_stats(svc)
    for cls in PLUGINS.values():
        parts.update(asyncio.run(cls.stats(svc)))
    assert {"status_cache", "idempotency_keys", "outbox", "retry_budget"} <= parts.keys()
    assert parts["outbox"]["pending"] == 0
    assert json.dumps(parts)  # what /admin/stats sends


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


def test_a_plugin_that_needs_json_names_the_plugin_that_provides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PLUGINS["list_query"], "needs", frozenset({"json"}))  # as a plugin reading the body may
    too_early = {**ROUTE, "methods": ["POST"], "plugins": ["auth", "list_query", "validate"]}
    missing = {**ROUTE, "methods": ["POST"], "plugins": ["auth", "list_query"]}
    for route, problem in ((too_early, "route `submit`: list_query needs `json`, which validate provides, but validate "
                                       "is listed after it: list validate before list_query"),
                           (missing, "route `submit`: list_query needs `json`, which no earlier plugin provides: list "
                                     "validate before it")):
        with pytest.raises(ValidationError) as err:
            RouteConfig.model_validate(route)
        [error] = err.value.errors()
        assert (error["loc"], error["msg"]) == (("plugins", 1, "list_query"), problem)


def _gated_context(authorization: bytes | None, task_id: str) -> RequestContext:
    headers = [(b"authorization", authorization)] if authorization is not None else []
    scope = {"type": "http", "method": "GET", "path": "/s", "headers": headers, "query_string": b"",
             "client": ("10.0.0.7", 5000)}
    return RequestContext(scope=scope, receive=context().receive, header_values=first_values(scope), method="GET",
                          route_name="status", upstream="exports", upstream_path="/s",
                          params={"task_id": task_id}, request_id="r")


def test_consecutive_gatekeepers_run_as_one_handler_each_keeping_its_refusals(tmp_path: Path) -> None:
    """rate_limit, auth and task_id run as one handler, and still refuse as each does: 404, 401, 429 (tenant and
    address), the 429 with its headers and the upstream never called."""
    svc = services(tmp_path)
    svc.tenants = TenantDirectory({"acme": [hash_key("k1")]}, Limits(
        by_tenant={"acme": TenantLimits(Quota(0.001, 2), Quota(0.001, 1), 5, 5)}, per_address=Quota(0.001, 1),
        hold=HoldSettings(hold_sec=0)))
    route = RouteConfig.model_validate({**ROUTE, "name": "status", "path": "/s/{task_id}", "methods": ["GET"],
                                        "plugins": [{"rate_limit": {"limit": "requests"}}, "auth",
                                                    {"task_id": {"action": "check"}}]})
    upstream = Scripted(200)
    chain: Any = build_chain(route, None, svc, upstream)
    assert isinstance(chain, Gatekeepers) and [type(g).__name__ for g in chain.gates] == \
        ["RateLimit", "Auth", "TaskId"] and chain.next is upstream

    def status(authorization: bytes | None, task_id: str = "exp-20260101-abcdefghij0123456789") -> int | str:
        try:
            resp = asyncio.run(chain(_gated_context(authorization, task_id)))
        except ApiError as exc:
            assert exc.kind != ErrorKind.UNAUTHORIZED or exc.headers["WWW-Authenticate"].startswith("Bearer")
            return exc.kind.status
        if resp.status == 429:  # which limit refused it
            assert resp.header("retry-after")
            return f"429 {resp.header('ratelimit-policy')}"
        return resp.status

    assert status(b"Bearer k1") == 200
    seen = upstream.calls[0]
    assert seen.tenant == "acme" and seen.upstream_headers["x-tenant-id"] == "acme"
    assert seen.task_id == "exp-20260101-abcdefghij0123456789"
    assert status(b"Bearer k1", "not-a-task") == 404  # the burst's second request: counted, then refused by id
    assert status(b"Bearer k1") == '429 "requests";q=2;w=2000'  # the tenant's burst of 2 is spent
    assert status(b"Bearer wrong") == 401  # an unknown key: the address's limit (1) admits it, auth refuses
    assert status(None) == '429 "address";q=1;w=1000'  # the address's burst is spent
    assert len(upstream.calls) == 1


def test_a_submit_routes_answer_carries_the_ratelimit_headers_through_the_gatekeepers(tmp_path: Path) -> None:
    svc = services(tmp_path)
    svc.tenants = TenantDirectory({"acme": [hash_key("k1")]}, Limits(
        by_tenant={"acme": TenantLimits(Quota(1, 5), Quota(0.001, 3), 7, 5)}))
    route = RouteConfig.model_validate({**ROUTE, "plugins": [{"rate_limit": {"limit": "submits",
                                                                             "active_tasks": True}}, "auth"]})
    upstream = Scripted(201)
    chain: Any = build_chain(route, None, svc, upstream)
    resp = asyncio.run(chain(_gated_context(b"Bearer k1", "")))
    assert resp.status == 201 and (resp.header("ratelimit") or "").startswith('"submits";r=2;t=100')
    assert upstream.calls[0].upstream_headers == {"x-tenant-max-active-tasks": "7", "x-tenant-id": "acme"}


def test_task_id_check_passes_a_task_id_and_answers_404_for_anything_else(tmp_path: Path) -> None:
    check: Any = plugin("task_id", {"action": "check"}, Scripted(200), services(tmp_path))
    task_id = new_task_id()
    for _ in range(2):
        assert asyncio.run(check(context(params={"task_id": task_id}))).status == 200
    for bad in ("exp-20260101-short", "", "EXP-20260101-abcdefghij0123456789"):
        with pytest.raises(ApiError) as refused:
            asyncio.run(check(context(params={"task_id": bad})))
        assert refused.value.kind == ErrorKind.TASK_NOT_FOUND
