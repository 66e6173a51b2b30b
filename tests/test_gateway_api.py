"""The public API through a real gateway in front of a real backend."""
from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable, Collection

import httpx
import pytest
import yaml

from exports_common.contract import TERMINAL
from exports_common.signing import DownloadSigner
from exports_common.task_ids import TASK_ID_PATTERN, new_task_id
from tests.conftest import (
    ADMIN_TOKEN,
    DEMO2_KEY,
    DEMO_KEY,
    SIGNING_SECRET,
    backend_config,
    gateway_config,
)
from tests.helpers import assert_envelope_error, upstream_calls, wait_status
from tests.procs import Service, wait_until

API = "/api/v1/exports"


class Stack:
    def __init__(self, backend: Service, gateway: Service) -> None:
        self.backend = backend
        self.gateway = gateway

    def client(self, key: str | None = DEMO_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.gateway.url, headers=headers, timeout=30)

    def submit(self, body: dict[str, Any], key: str = DEMO_KEY, **headers: str) -> httpx.Response:
        with self.client(key) as c:
            return c.post(API, json=body, headers=headers)

    def wait(self, task_id: str, statuses: Collection[str] | None = None, key: str = DEMO_KEY) -> dict[str, Any]:
        return wait_status(self.gateway.url, task_id, statuses or TERMINAL, path=f"{API}/",
                           headers={"Authorization": f"Bearer {key}"})

    def upstream_calls(self, route: str) -> int:
        return upstream_calls(self.gateway.url, route)


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    workdir = tmp_path_factory.mktemp("stack")
    backend = module_services("backend_stub", backend_config(workdir), name="backend")
    config = gateway_config(workdir, backend.url)
    echo = module_services("tests.echo_upstream", {}, name="echo")
    config["upstreams"]["echo"] = {"url": echo.url, "timeouts": {"connect": 1, "read": 5}}
    config["routes"].append({"name": "echo", "path": "/echo/{rest}", "methods": ["GET", "POST"],
                             "upstream": "echo", "rewrite": "/got/{rest}", "max_body_bytes": 1000,
                             "plugins": ["auth"]})
    gateway = module_services("gateway", config, name="gateway")
    return Stack(backend, gateway)


def test_submit_answers_202_with_location_and_retry_after(stack: Stack) -> None:
    resp = stack.submit({"export_type": "order_export", "filters": {"region": "eu-west"}})
    assert resp.status_code == 202, resp.text
    data = resp.json()["data"]
    assert resp.json()["code"] == 0 and resp.json()["message"] == "success"
    assert TASK_ID_PATTERN.match(data["task_id"]) and data["task_id"].startswith("exp-")
    assert data["status"] == "PENDING" and data["estimated_completion_sec"] >= 1
    assert resp.headers["location"] == f"{API}/{data['task_id']}"
    assert resp.headers["retry-after"] == "1"
    assert resp.headers["x-request-id"]


def test_poll_miss_then_hit_and_retry_after_while_running(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "slow_export"}).json()["data"]["task_id"]
    with stack.client() as c:
        running = c.get(f"{API}/{task_id}")
        assert running.headers["x-cache"] == "MISS" and running.headers["retry-after"] == "1"
        assert c.post(f"{API}/{task_id}/cancel").status_code == 200
        first = c.get(f"{API}/{task_id}")
        second = c.get(f"{API}/{task_id}")
    assert first.json()["data"]["status"] == "CANCELLED"
    assert first.headers["x-cache"] == "MISS" and second.headers["x-cache"] == "HIT"
    assert second.json() == first.json() and "retry-after" not in second.headers
    assert "server" not in second.headers and "date" in second.headers, "no server software named; a Date"


def test_fifty_concurrent_pollers_make_one_backend_call(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
    # wait on the backend itself, so the gateway's cache is still cold when the storm starts
    wait_status(stack.backend.url, task_id, headers={"X-Tenant-Id": "demo"})
    before = stack.upstream_calls("status")

    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.gateway.url, headers={"Authorization": f"Bearer {DEMO_KEY}"},
                                     timeout=30) as client:
            return await asyncio.gather(*(client.get(f"{API}/{task_id}") for _ in range(50)))

    answers = asyncio.run(storm())
    assert {r.status_code for r in answers} == {200}
    assert {r.json()["data"]["status"] for r in answers} == {"COMPLETED"}
    assert stack.upstream_calls("status") - before == 1


def test_cancel_semantics(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "slow_export"}).json()["data"]["task_id"]
    with stack.client() as c:
        first = c.post(f"{API}/{task_id}/cancel")
        again = c.post(f"{API}/{task_id}/cancel")
        done_id = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
        stack.wait(done_id)
        late = c.post(f"{API}/{done_id}/cancel")
    assert first.status_code == 200 and first.json()["data"]["status"] == "CANCELLED"
    assert again.status_code == 200 and again.json()["data"]["status"] == "CANCELLED"
    body = assert_envelope_error(late, 409, 40904)
    assert body["data"]["status"] == "COMPLETED"
    assert "/download?expires=" in body["data"]["result"]["download_url"]


def test_signed_download_range_tamper_and_expiry(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
    done = stack.wait(task_id)
    url = done["result"]["download_url"]
    assert url.startswith(f"{stack.gateway.url}{API}/{task_id}/download?expires=")
    anonymous = stack.client(None)
    whole = anonymous.get(url)
    assert whole.status_code == 200 and len(whole.content) == done["result"]["bytes"]
    assert whole.text.startswith("day,region,metric,value")
    part = anonymous.get(url, headers={"Range": "bytes=4-9"})
    assert part.status_code == 206 and part.content == whole.content[4:10]
    assert_envelope_error(anonymous.get(url[:-1] + ("0" if url[-1] != "0" else "1")), 403, 40300)
    assert_envelope_error(anonymous.get(url.split("?")[0]), 403, 40300)
    other = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
    found = re.search(r"expires=(\d+)", url)
    assert found is not None, url
    expires = int(found.group(1))
    swapped = url.replace(task_id, other)
    assert_envelope_error(anonymous.get(swapped), 403, 40300)
    past = int(time.time()) - 10
    past_sig = DownloadSigner([SIGNING_SECRET]).sign(task_id, past)
    expired = f"{stack.gateway.url}{API}/{task_id}/download?expires={past}&sig={past_sig}"
    assert_envelope_error(anonymous.get(expired), 410, 41000)
    assert expires > time.time()


def test_large_download_streams_with_flat_gateway_memory(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "big_export"}).json()["data"]["task_id"]
    done = wait_status(stack.gateway.url, task_id, path=f"{API}/", timeout=60,
                       headers={"Authorization": f"Bearer {DEMO_KEY}"})
    size = done["result"]["bytes"]
    assert size > 40_000_000
    before = stack.gateway.rss_bytes()
    peak, received = before, 0
    with httpx.stream("GET", done["result"]["download_url"], timeout=60) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_bytes(1 << 20):
            received += len(chunk)
            peak = max(peak, stack.gateway.rss_bytes())
    assert received == size
    assert peak - before < 20 * 1024 * 1024, \
        f"gateway grew by {(peak - before) / 2**20:.1f} MiB for {size / 2**20:.0f} MiB"


def test_list_is_own_tasks_newest_first_with_cursor_and_signed_links(stack: Stack) -> None:
    ids = [stack.submit({"export_type": "report_export"}, key=DEMO2_KEY).json()["data"]["task_id"] for _ in range(3)]
    for task_id in ids:
        stack.wait(task_id, key=DEMO2_KEY)
    with stack.client(DEMO2_KEY) as c:
        page1 = c.get(API, params={"limit": 2}).json()["data"]
        page2 = c.get(API, params={"limit": 2, "cursor": page1["next_cursor"]}).json()["data"]
        completed = c.get(API, params={"status": "COMPLETED", "limit": 500}).json()["data"]["items"]
    assert [t["task_id"] for t in page1["items"] + page2["items"]][:3] == list(reversed(ids))
    assert all("/download?expires=" in t["result"]["download_url"] for t in completed)
    with stack.client(DEMO_KEY) as c:
        theirs = {t["task_id"] for t in c.get(API, params={"limit": 500}).json()["data"]["items"]}
    assert not theirs & set(ids)


def test_tenant_isolation_on_every_endpoint(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
    stack.wait(task_id)
    with stack.client(DEMO2_KEY) as c:
        assert_envelope_error(c.get(f"{API}/{task_id}"), 404, 40401)
        assert_envelope_error(c.post(f"{API}/{task_id}/cancel"), 404, 40401)
        assert_envelope_error(c.get(f"{API}/{task_id}", headers={"X-Tenant-Id": "demo"}), 404, 40401)
    with stack.client(DEMO_KEY) as c:
        link = c.get(f"{API}/{task_id}").json()["data"]["result"]["download_url"]
    with stack.client(DEMO2_KEY) as c:
        assert_envelope_error(c.get(link), 404, 40401)
    with stack.client(DEMO_KEY) as c:
        assert c.get(link).status_code == 200


def test_size_limits_on_headers_and_filters(stack: Stack) -> None:
    with stack.client() as c:
        assert_envelope_error(c.get(API, headers={"X-Big": "a" * 9000}), 431, 43100)
        filters = {f"k{i}": "v" * 100 for i in range(100)}
        resp = c.post(API, json={"export_type": "order_export", "filters": filters})
        assert assert_envelope_error(resp, 422, 42200)["data"]["field"] == "filters"


def test_auth_is_required_and_keys_are_checked(stack: Stack) -> None:
    with stack.client(None) as c:
        resp = c.post(API, json={"export_type": "order_export"})
        assert_envelope_error(resp, 401, 40100)
        assert resp.headers["www-authenticate"].startswith("Bearer")
        assert_envelope_error(c.get(API, headers={"Authorization": "Bearer wrong"}), 401, 40100)
        assert_envelope_error(c.get(API, headers={"Authorization": f"Basic {DEMO_KEY}"}), 401, 40100)
        assert_envelope_error(c.get("/admin/routes"), 401, 40100)
        assert_envelope_error(c.get("/admin/stats", headers={"Authorization": f"Bearer {DEMO_KEY}"}), 401, 40100)


def test_idempotency_replay_mismatch_and_per_tenant(stack: Stack) -> None:
    key = f"order-{time.time_ns()}"
    body = {"export_type": "report_export", "filters": {"metric": "orders"}}
    first = stack.submit(body, **{"Idempotency-Key": key})
    replay = stack.submit({"filters": {"metric": "orders"}, "export_type": "report_export"}, **{"Idempotency-Key": key})
    assert first.status_code == replay.status_code == 202
    assert replay.json() == first.json() and replay.headers["idempotent-replayed"] == "true"
    assert replay.headers["location"] == first.headers["location"]
    assert "idempotent-replayed" not in first.headers
    assert_envelope_error(stack.submit(dict(body, format="jsonl"), **{"Idempotency-Key": key}), 422, 42201)
    theirs = stack.submit(body, key=DEMO2_KEY, **{"Idempotency-Key": key})
    assert theirs.status_code == 202 and theirs.json()["data"]["task_id"] != first.json()["data"]["task_id"]
    assert_envelope_error(stack.submit(body, **{"Idempotency-Key": "x" * 256}), 422, 42200)
    assert_envelope_error(stack.submit(body, **{"Idempotency-Key": "tab\there"}), 422, 42200)


def test_idempotency_in_flight_is_409(stack: Stack) -> None:
    key = f"inflight-{time.time_ns()}"
    body = {"export_type": "report_export"}

    async def race() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=30,
                                     headers={"Authorization": f"Bearer {DEMO_KEY}", "Idempotency-Key": key}) as c:
            stack.backend.signal(signal.SIGSTOP)
            try:
                first = asyncio.create_task(c.post(API, json=body))
                await asyncio.sleep(0.5)  # the first request is now parked on the stopped backend
                second = await c.post(API, json=body)
            finally:
                stack.backend.signal(signal.SIGCONT)
            return await first, second

    first, second = asyncio.run(race())
    assert first.status_code == 202
    assert_envelope_error(second, 409, 40902)
    assert second.headers["retry-after"] == "1"
    assert stack.submit(body, **{"Idempotency-Key": key}).headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize("content,content_type,status,code", [
    (b'{"export_type": "order_export"', "application/json", 400, 40001),
    (b"export_type=order_export", "application/x-www-form-urlencoded", 415, 41500),
    (b'{"export_type": "order_export"}', None, 415, 41500),
    (b'{"export_type": "order_export", "filters": {"x": "' + b"y" * 70_000 + b'"}}', "application/json", 413, 41300),
    (b'{"export_type": "order_export", "filters": ' + b'{"a": ' * 40 + b"1" + b"}" * 41,
     "application/json", 422, 42200),
    (b'{"export_type": "no_such_export"}', "application/json", 422, 42200),
    (b'{"export_type": "order_export", "filters": {"region": "mars"}}', "application/json", 422, 42200),
    (b'{"export_type": "order_export", "timeout_sec": 99999}', "application/json", 422, 42200),
    (b'{"export_type": "order_export", "format": "xml"}', "application/json", 422, 42200),
    (b'[1, 2]', "application/json", 422, 42200),
    (b'{"export_type": "order_export", "task_id": "exp-20260101-aaaaaaaaaaaaaaaa"}', "application/json", 422, 42200),
])
def test_bad_submit_input_is_refused_and_nothing_is_created(stack: Stack, content: bytes, content_type: str | None,
                                                          status: int, code: int) -> None:
    with stack.client() as c:
        before = c.get(API, params={"limit": 500}).json()["data"]["items"]
        headers = {"Content-Type": content_type} if content_type else {}
        resp = c.post(API, content=content, headers=headers)
        assert_envelope_error(resp, status, code)
        after = c.get(API, params={"limit": 500}).json()["data"]["items"]
    assert len(after) == len(before)


@pytest.mark.parametrize("url", [
    "http://10.0.0.1/cb", "http://169.254.169.254/latest/meta-data", "http://[::1]:8000/cb",
    "http://[::ffff:10.0.0.1]/cb", "http://167772161/cb", "http://192.168.1.10/cb", "file:///etc/passwd",
])
def test_callback_urls_to_private_addresses_are_refused(stack: Stack, url: str) -> None:
    resp = stack.submit({"export_type": "order_export", "callback_url": url})
    assert assert_envelope_error(resp, 422, 42200)["data"]["field"] == "callback_url"


def test_allow_listed_loopback_callback_is_accepted(stack: Stack) -> None:
    resp = stack.submit({"export_type": "report_export", "callback_url": "http://127.0.0.1:9/cb"})
    assert resp.status_code == 202
    assert resp.json()["data"]["callback"]["state"] == "PENDING"


def test_malformed_task_id_is_404_without_upstream_call(stack: Stack) -> None:
    before = stack.upstream_calls("status") + stack.upstream_calls("cancel")
    with stack.client() as c:
        for bad in ["nope", "exp-2026-abc", "EXP-20261129-aaaaaaaaaaaaaaaa", "exp-20261129-" + "a" * 33]:
            assert_envelope_error(c.get(f"{API}/{bad}"), 404, 40401)
            assert_envelope_error(c.post(f"{API}/{bad}/cancel"), 404, 40401)
        assert_envelope_error(c.get(f"{API}/{new_task_id()}"), 404, 40401)
    assert stack.upstream_calls("status") + stack.upstream_calls("cancel") - before == 1


def test_unknown_path_and_wrong_method(stack: Stack) -> None:
    with stack.client() as c:
        assert_envelope_error(c.get("/api/v2/nothing"), 404, 40400)
        resp = c.delete(API)
        assert_envelope_error(resp, 405, 40500)
        assert set(resp.headers["allow"].split(", ")) == {"GET", "POST"}


def test_proxy_headers_both_ways(stack: Stack) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with stack.client() as c:
        resp = c.get("/echo/x?q=1", headers={
            "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "X-Tenant-Id": "demo2", "X-Task-Id": "spoof",
            "X-Request-Id": "req-123", "Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "X-Keep": "yes",
        })
        too_big = c.post("/echo/x", content=b"z" * 2000)
    data = resp.json()["data"]
    headers = {k: v for k, v in data["headers"]}
    assert data["path"] == "/got/x" and data["query"] == "q=1"
    assert headers["x-tenant-id"] == "demo" and "x-task-id" not in headers
    assert headers["x-forwarded-for"] == "127.0.0.1" and headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"] == f"127.0.0.1:{stack.gateway.port}"
    assert headers["x-request-id"] == "req-123" and resp.headers["x-request-id"] == "req-123"
    assert headers["traceparent"].split("-")[1] == trace_id
    assert "x-drop-me" not in headers and headers["x-keep"] == "yes" and "authorization" not in headers
    assert "x-secret-hop" not in resp.headers and "keep-alive" not in resp.headers
    assert_envelope_error(too_big, 413, 41300)


def test_a_request_without_traceparent_starts_a_trace_upstream(stack: Stack) -> None:
    with stack.client() as c:
        sent = [{k: v for k, v in c.get("/echo/x").json()["data"]["headers"]}["traceparent"] for _ in range(2)]
    for traceparent in sent:
        assert re.fullmatch(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-0[01]", traceparent), traceparent
    assert sent[0].split("-")[1] != sent[1].split("-")[1], "each request gets a trace of its own"


def test_ops_endpoints(stack: Stack) -> None:
    task_id = stack.submit({"export_type": "report_export"}).json()["data"]["task_id"]
    stack.wait(task_id)  # a finished task: its next poll is a cache hit, which /admin/stats counts
    with stack.client() as c:
        assert c.get(f"{API}/{task_id}").headers["x-cache"] == "HIT"
        assert c.get(API, params={"limit": 1}).status_code == 200  # one proxied call, timed both ways
    with stack.client(None) as c:
        assert c.get("/healthz").json()["data"]["status"] == "ok"
        assert c.get("/readyz").status_code == 200
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "gateway_requests_total" in metrics.text
        assert "gateway_status_cache_total" in metrics.text
        # real Prometheus histograms, in seconds, that histogram_quantile() can read
        assert re.search(r'^gateway_request_duration_seconds_bucket\{le="0\.1",route="list"\} [1-9]',
                         metrics.text, re.M)
        assert re.search(r'^gateway_upstream_duration_seconds_bucket\{le="\+Inf",route="list",upstream="exports"\} '
                         r'[1-9]', metrics.text, re.M)
        assert re.search(r'^gateway_upstream_duration_seconds_count\{route="list",upstream="exports"\}', metrics.text,
                         re.M)
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        routes = c.get("/admin/routes", headers=admin).json()["data"]
        assert {r["name"] for r in routes["routes"]} >= {"submit", "status", "cancel", "download", "list"}
        assert routes["admin_token"] == "***" and SIGNING_SECRET not in str(routes)
        # the values in force: each route's plugins as a request meets them, then its upstream call, defaults resolved
        submit = next(r for r in routes["routes"] if r["name"] == "submit")
        assert [next(iter(p)) for p in submit["plugins"]] == ["rate_limit", "auth", "validate", "idempotency",
                                                              "task_id", "outbox"]
        assert {"auth": {"required": True}} in submit["plugins"]
        assert submit["policy"]["retry"]["budget"] == {"ratio": 0.2, "min_concurrent": 3}
        assert submit["policy"]["timeout"] == {"connect": 2, "read": 10, "total": 15}
        assert submit["policy"]["circuit_breaker"] == {"name": "exports", "fail_max": 5, "reset_timeout_sec": 10,
                                                       "failure_statuses": [500, 502, 503, 504], "window_sec": 10}
        download = next(r for r in routes["routes"] if r["name"] == "download")
        assert download["policy"]["circuit_breaker"]["name"] == "exports@download"
        assert routes["upstreams"]["exports"]["circuit_breaker"]["fail_max"] == 5
        stats = c.get("/admin/stats", headers=admin).json()["data"]
        assert stats["status_cache"]["hits"] >= 1 and stats["outbox"]["pending"] == 0
        assert stats["retry_budget"]["exports"]["requests_in_flight"] == 0
        assert c.get("/admin/breakers", headers=admin).json()["data"]["exports"]["state"] == "closed"


def test_upstream_down_is_502_and_hung_is_504(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    config = gateway_config(tmp_path, backend.url)
    config["upstreams"]["exports"]["timeouts"] = {"connect": 1, "read": 1}
    del config["upstreams"]["exports"]["circuit_breaker"]
    for route in config["routes"]:  # the proxy's own answers, without the policy or degradation
        route.pop("policy", None)
        route["plugins"] = [p for p in route["plugins"] if not isinstance(p, dict) or not set(p) & {
            "outbox", "stale_if_error", "rerun"}]
    gateway = services("gateway", config)
    headers = {"Authorization": f"Bearer {DEMO_KEY}"}
    backend.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = httpx.get(f"{gateway.url}{API}?limit=1", headers=headers, timeout=10)
        assert_envelope_error(hung, 504, 50400)
        assert 0.9 < time.monotonic() - started < 3
    finally:
        backend.signal(signal.SIGCONT)
    backend.kill()
    down = httpx.post(f"{gateway.url}{API}", json={"export_type": "order_export"}, headers=headers, timeout=10)
    assert_envelope_error(down, 502, 50200)


def test_reload_refuses_a_broken_config_and_applies_a_good_one(services: Callable[..., Service],
                                                               tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    good = gateway.config_path.read_text()
    gateway.config_path.write_text(good.replace("upstream: exports", "upstream: nowhere", 1))
    resp = httpx.post(f"{gateway.url}/admin/reload", headers=admin)
    assert_envelope_error(resp, 422, 42200)
    assert any("nowhere" in p for p in resp.json()["data"]["problems"])
    assert httpx.get(f"{gateway.url}{API}", headers={"Authorization": f"Bearer {DEMO_KEY}"}).status_code == 200
    config = yaml.safe_load(good)
    config["tenants"]["demo"]["api_key_hashes"] = []
    gateway.config_path.write_text(yaml.safe_dump(config))
    wait_until(lambda: httpx.get(f"{gateway.url}{API}", headers={"Authorization": f"Bearer {DEMO_KEY}"}
                                 ).status_code == 401, 10, what="the file watcher to apply the new config")
    config["redis_prefix"] = "moved"  # read once at start: applied with the rest, and named as waiting for a restart
    # pool sizes apply on reload, a new upstream's too: never named as waiting for a restart
    config["upstreams"]["exports"]["pool_size"] = 50
    config["upstreams"]["reports"] = {"url": "http://127.0.0.1:9", "pool_size": 3}
    gateway.config_path.write_text(yaml.safe_dump(config))
    resp = httpx.post(f"{gateway.url}/admin/reload", headers=admin)
    assert resp.status_code == 200 and resp.json()["data"]["restart_required"] == ["redis_prefix"]


def test_console_tracing_records_a_span_per_request_and_upstream_call(services: Callable[..., Service],
                                                                     tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    # the client's sampled flag decides (it comes from a trusted address), not the ratio
    tracing = {"exporter": "console", "sample_ratio": 0, "trusted_proxies": ["127.0.0.0/8"]}
    gateway = services("gateway", gateway_config(tmp_path, backend.url, tracing=tracing))
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    httpx.get(f"{gateway.url}{API}?limit=1", headers={"Authorization": f"Bearer {DEMO_KEY}",
                                                       "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})

    def spans() -> list[str]:
        log = gateway.log()
        return [name for name in ("GET /api/v1/exports", "upstream exports") if f'"name": "{name}"' in log]

    assert wait_until(lambda: len(spans()) == 2, 10, what="both spans in the console exporter's output")
    assert f"0x{trace_id}" in gateway.log()
