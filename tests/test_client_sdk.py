"""The client SDK (exports_client) against a real gateway and backend, plus its timing policy on a fake clock."""
from __future__ import annotations

import ast
import asyncio
import base64
import dataclasses
import itertools
import json
import os
import random
import subprocess
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks as swh

from benchmarks.bench_client_polling import (
    SimClock,
    gateway_retry_after,
    herd,
    polling_cost,
)
from exports_client import (
    ApiError,
    AsyncExportsClient,
    ExportsClient,
    NotFound,
    RateLimited,
    Task,
    Unavailable,
    WaitTimeout,
    WebhookVerificationError,
    polling,
    verify_webhook,
)
from exports_client.models import STATUSES, CallbackState, Result, TaskError
from exports_common import webhooks
from tests.client_stack import SLOW_DELAY_SEC, ClientStack, CuttingProxy, start_stack
from tests.conftest import DEMO2_KEY, DEMO_KEY
from tests.procs import ROOT, Service, wait_until
from tests.receiver import Receiver

UNKNOWN_ID = "exp-20261129-0000000000000000"


@pytest.fixture(scope="module")
def proxy() -> Iterator[CuttingProxy]:
    p = CuttingProxy()
    yield p
    p.close()


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory,
          proxy: CuttingProxy) -> ClientStack:
    # links name the proxy, so a download can be cut on its way to the client
    started = start_stack(module_services, tmp_path_factory.mktemp("sdk"), public_base_url=proxy.url)
    proxy.target_port = started.gateway.port
    return started


class Recorder(httpx.HTTPTransport):
    """The real transport, noting when each request went out and what came back."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[float, str, str, int | None, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        at = time.monotonic()
        try:
            resp = super().handle_request(request)
        except httpx.TransportError:
            self.log.append((at, request.method, request.url.path, None, None))
            raise
        self.log.append((at, request.method, request.url.path, resp.status_code, resp.headers.get("retry-after")))
        return resp


def client(stack: ClientStack, key: str = DEMO_KEY, **kwargs: Any) -> ExportsClient:
    return ExportsClient(stack.gateway.url, key, **kwargs)


# -- round trips -----------------------------------------------------------------------------------


def test_sync_round_trip_submit_wait_download_list_types(stack: ClientStack, tmp_path: Path) -> None:
    with client(stack) as c:
        types_ = {t.export_type: t for t in c.export_types()}
        assert {"order_export", "report_export", "slow_export"} <= set(types_)
        assert types_["report_export"].filters_schema["properties"]["metric"]["anyOf"][0]["enum"] == [
            "revenue", "orders", "visits", "signups"]
        submitted = c.submit("report_export", {"metric": ["revenue", "orders"], "date_from": "2026-01-01"},
                             format="jsonl")
        assert submitted.status == "PENDING" and submitted.export_type == "report_export"
        seen: list[Task] = []
        done = c.wait(submitted.task_id, on_progress=seen.append, max_wait=60)
        assert done.status == "COMPLETED" and done.progress == 100 and done.result is not None
        path = c.download(done.task_id, tmp_path / "out.jsonl")
        assert path == tmp_path / "out.jsonl" and path.stat().st_size == done.result.bytes
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == done.result.rows and all(r["metric"] in ("revenue", "orders") for r in rows)
        assert not (tmp_path / "out.jsonl.part").exists()
        assert submitted.task_id in [t.task_id for t in c.list(status="COMPLETED")]
        assert c.get(done.task_id) == done


def test_async_round_trip_and_list_walks_every_page(stack: ClientStack, tmp_path: Path) -> None:
    async def run() -> None:
        async with AsyncExportsClient(stack.gateway.url, DEMO_KEY) as c:
            ids = [(await c.submit("report_export", {"metric": "visits"})).task_id for _ in range(3)]
            done = [await c.wait(i, max_wait=60) for i in ids]
            assert {t.status for t in done} == {"COMPLETED"}
            listed = [t.task_id async for t in c.list(page_size=1)]
            assert set(ids) <= set(listed) and len(listed) == len(set(listed))
            path = await c.download(done[0], tmp_path / "a.csv")
            assert path is not None and path.read_bytes().startswith(b"day,")
            assert path.stat().st_size == (done[0].result.bytes if done[0].result else -1)
            assert [t.export_type for t in await c.export_types()]
            with pytest.raises(NotFound):
                await c.get(UNKNOWN_ID)

    asyncio.run(run())


def test_env_fallback_and_typed_errors(stack: ClientStack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPORTS_URL", stack.gateway.url)
    monkeypatch.setenv("EXPORTS_API_KEY", DEMO_KEY)
    with ExportsClient() as c:
        with pytest.raises(NotFound) as missing:
            c.get(UNKNOWN_ID)
        assert missing.value.code == 40401 and missing.value.status == 404
        with pytest.raises(ApiError) as invalid:
            c.submit("no_such_type")
        assert invalid.value.status == 422 and invalid.value.code == 42200 and invalid.value.data["field"]
    with ExportsClient(api_key="wrong-key") as c, pytest.raises(ApiError) as denied:
        c.get(UNKNOWN_ID)
    assert denied.value.code == 40100
    with ExportsClient(f"{stack.gateway.url}/down", DEMO_KEY, retries=2, sleep=lambda s: None) as c, \
            pytest.raises(Unavailable) as down:
        c.get(UNKNOWN_ID)
    assert down.value.status == 503 and down.value.code == 50300


# -- submitting safely ------------------------------------------------------------------------------


def test_submit_timed_out_on_the_client_is_retried_with_the_same_key_and_makes_one_task(stack: ClientStack) -> None:
    recorder = Recorder()
    with ExportsClient(f"{stack.gateway.url}/slow", DEMO2_KEY, timeout=1.0, retries=8, transport=recorder) as c:
        task = c.submit("report_export", {"metric": "orders"})
    posts = [entry for entry in recorder.log if entry[1] == "POST"]
    assert posts[0][3] is None, "the first try must have timed out on the client"
    assert posts[-1][3] == 202 and len(posts) >= 2
    with client(stack, DEMO2_KEY) as c:
        mine = list(c.list())
    assert [t.task_id for t in mine] == [task.task_id], "one submission, one task"
    assert posts[-1][0] - posts[0][0] >= SLOW_DELAY_SEC - 1.0


def test_submit_sends_an_idempotency_key_and_replays_with_a_given_one(stack: ClientStack) -> None:
    with client(stack) as c:
        first = c.submit("report_export", {"metric": "signups"}, idempotency_key="sdk-test-key-1")
        again = c.submit("report_export", {"metric": "signups"}, idempotency_key="sdk-test-key-1")
        assert again.task_id == first.task_id
        other = c.submit("report_export", {"metric": "signups"})
        assert other.task_id != first.task_id


# -- waiting ------------------------------------------------------------------------------------------


def test_wait_honours_retry_after_and_gives_up_at_max_wait_with_a_resume_token(stack: ClientStack) -> None:
    recorder = Recorder()
    with client(stack, transport=recorder, streams=False) as c:
        task = c.submit("slow_export")
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as timeout:
            c.wait(task.task_id, max_wait=9)
        elapsed = time.monotonic() - started
        assert 9 <= elapsed <= 12, elapsed
        assert timeout.value.task is not None and timeout.value.task.status in ("PENDING", "RUNNING")
        polls = [e for e in recorder.log if e[1] == "GET"]
        assert len(polls) >= 4
        for (at, *_, asked), (next_at, *_) in itertools.pairwise(polls):
            assert asked is not None
            gap = next_at - at
            # never sooner than asked; later by at most the 20% jitter plus the poll's own time on a loaded machine
            assert float(asked) - 0.05 <= gap <= float(asked) * 1.2 + 1.5, (asked, gap)
        token = json.loads(timeout.value.resume_token)
        assert token["v"] == 1 and token["task_id"] == task.task_id
        recorder.log.clear()
        resumed_at = time.time()
        with pytest.raises(WaitTimeout):
            c.wait(timeout.value.resume_token, max_wait=2)
        resumed = [e for e in recorder.log if e[1] == "GET"]
        # the resumed wait keeps the schedule: no poll before the time the gateway last asked for
        if resumed:
            assert resumed[0][0] - time.monotonic() + time.time() >= token["not_before"] - 0.05
        else:
            assert token["not_before"] > resumed_at + 2 - 0.05
        assert c.cancel(task.task_id).status == "CANCELLED"


def test_wait_backs_off_through_a_503_and_a_dead_gateway() -> None:
    sim = SimulatedGateway(duration=40, outage=(5, 20))
    clock = sim.clock
    with ExportsClient("http://gw.test", "k", transport=httpx.MockTransport(sim.handle), clock=clock.now,
                       sleep=clock.sleep, rng=random.Random(3), streams=False) as c:
        done = c.wait("exp-20261129-aaaaaaaaaaaaaaaa")
    assert done.status == "COMPLETED"
    gaps = [b - a for a, b in itertools.pairwise(sim.polls)]
    refused = [b - a for (a, status, asked), b in zip(sim.answers[:-1], sim.polls[1:], strict=True) if status == 503]
    assert refused and all(gap >= 5.0 for gap in refused), refused   # the outage asks for 5 s
    assert min(gaps) >= 1.0


def test_wait_raises_unavailable_when_the_gateway_stays_unreachable() -> None:
    clock = SimClock()
    start = clock.t

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with ExportsClient("http://gw.test", "k", transport=httpx.MockTransport(refuse), clock=clock.now,
                       sleep=clock.sleep, retries=3) as c, pytest.raises(Unavailable) as err:
        c.wait("exp-20261129-aaaaaaaaaaaaaaaa")
    assert err.value.status is None and clock.t - start < 60  # given up long before max_wait


def test_rate_limited_after_the_retries_carries_retry_after() -> None:
    # no rate limiter runs on this branch's gateway, so the 429 comes from a stub
    clock = SimClock()
    calls = []

    def limited(request: httpx.Request) -> httpx.Response:
        calls.append(clock.t)
        return httpx.Response(429, headers={"Retry-After": "2"},
                              json={"code": 42900, "message": "slow down", "data": None})

    with ExportsClient("http://gw.test", "k", transport=httpx.MockTransport(limited), clock=clock.now,
                       sleep=clock.sleep, retries=3) as c, pytest.raises(RateLimited) as err:
        c.get("exp-20261129-aaaaaaaaaaaaaaaa")
    assert err.value.retry_after == 2 and err.value.code == 42900 and len(calls) == 4
    assert all(2.0 <= b - a <= 2.4 for a, b in itertools.pairwise(calls))


def test_a_retry_after_in_other_digits_counts_as_none() -> None:
    """A hostile gateway's `Retry-After: ²` is read as no Retry-After, not a ValueError out of the SDK."""
    from exports_client.polling import parse_retry_after
    assert parse_retry_after(" 7 ") == 7.0
    assert [parse_retry_after(v) for v in ("\u00b2", "\u0663", "1.5", "soon")] == [None] * 4


def test_resume_token_is_json_and_a_bad_one_is_refused() -> None:
    plan = polling.plan_for("exp-20261129-aaaaaaaaaaaaaaaa", 100.0, 300, random.Random(1))
    plan.answered(100.0, Task("exp-20261129-aaaaaaaaaaaaaaaa", "RUNNING"), 8)
    again = polling.plan_for(plan.token(), 105.0, 300, random.Random(1))
    assert (again.task_id, again.not_before, again.step) == (plan.task_id, round(plan.not_before, 3), plan.step)
    for bad in ('{"v": 2, "task_id": "x"}', "{not json", '{"v": 1}'):
        with pytest.raises(Exception) as err:
            polling.plan_for(bad, 0.0, 1, random.Random())
        assert "token" in str(err.value)


# -- downloading --------------------------------------------------------------------------------------


def test_download_cut_in_the_middle_resumes_with_range_and_matches(stack: ClientStack, proxy: CuttingProxy,
                                                                    tmp_path: Path) -> None:
    with ExportsClient(proxy.url, DEMO_KEY) as c:
        done = c.wait(c.submit("order_export").task_id, max_wait=60)
        assert done.result is not None and done.result.bytes > 1_000_000
        whole = tmp_path / "whole.csv"
        c.download(done, whole)
        proxy.ranges.clear()
        proxy.cut_after = done.result.bytes // 3
        cut = tmp_path / "cut.csv"
        assert c.download(done.task_id, cut) == cut
    assert proxy.cuts == 1
    assert len(proxy.ranges) == 1 and proxy.ranges[0].lower().startswith("range: bytes=")
    assert int(proxy.ranges[0].split("=")[1].rstrip("-")) > 0
    assert cut.read_bytes() == whole.read_bytes()


def test_download_resumes_a_part_file_left_by_an_earlier_run_and_writes_to_file_objects(
        stack: ClientStack, proxy: CuttingProxy, tmp_path: Path) -> None:
    with ExportsClient(proxy.url, DEMO_KEY) as c:
        done = c.wait(c.submit("report_export").task_id, max_wait=60)
        full = tmp_path / "full.csv"
        c.download(done, full)
        data = full.read_bytes()
        proxy.cut_after = 1000  # an earlier run, cut off with no attempt left: its part file stays
        with pytest.raises(Unavailable):
            c.download(done, tmp_path / "again.csv", attempts=1)
        kept = (tmp_path / "again.csv.part").stat().st_size
        assert 0 < kept < len(data)
        proxy.ranges.clear()
        c.download(done, tmp_path / "again.csv")
        assert proxy.ranges == [f"Range: bytes={kept}-"]
        assert (tmp_path / "again.csv").read_bytes() == data
        assert not (tmp_path / "again.csv.part.json").exists()
        with open(tmp_path / "obj.csv", "wb") as f:
            c.download(done, f)
        assert (tmp_path / "obj.csv").read_bytes() == data


def test_a_part_file_of_another_task_or_another_file_is_started_over_never_mixed(
        stack: ClientStack, proxy: CuttingProxy, tmp_path: Path) -> None:
    with ExportsClient(proxy.url, DEMO_KEY) as c:
        first, second = (c.wait(c.submit("report_export", {"metric": [metric]}).task_id, max_wait=60)
                         for metric in ("revenue", "visits"))
        files = {}
        for task in (first, second):
            c.download(task, tmp_path / task.task_id)
            files[task.task_id] = (tmp_path / task.task_id).read_bytes()
        assert files[first.task_id] != files[second.task_id] and len(files[first.task_id]) > 800
        dest = tmp_path / "out.csv"
        part, meta = tmp_path / "out.csv.part", tmp_path / "out.csv.part.json"
        # left by the first task's download, then asked for the second's: started over
        proxy.cut_after = 500
        with pytest.raises(Unavailable):
            c.download(first, dest, attempts=1)
        assert json.loads(meta.read_text())["task_id"] == first.task_id and part.exists()
        proxy.ranges.clear()
        c.download(second, dest)
        assert proxy.ranges == [] and dest.read_bytes() == files[second.task_id]
        # the same task's key, but the bytes of another file (its ETag differs): the If-Range answer is whole
        part.write_bytes(files[first.task_id][:700])
        meta.write_text(json.dumps({"task_id": second.task_id, "etag": '"another-file"'}))
        c.download(second, dest)
        assert proxy.ranges == ["Range: bytes=700-"] and dest.read_bytes() == files[second.task_id]
        # a part file no run of this SDK keyed (an older one's, or a stranger's): started over
        part.write_bytes(files[first.task_id][:700])
        assert not meta.exists()  # the download before ended whole: its key went with it
        proxy.ranges.clear()
        c.download(second, dest)
        assert proxy.ranges == [] and dest.read_bytes() == files[second.task_id]


# -- callbacks ----------------------------------------------------------------------------------------


def test_verify_webhook_on_a_real_callback_and_refusals(stack: ClientStack) -> None:
    with Receiver() as receiver, client(stack) as c:
        task = c.submit("report_export", callback_url=receiver.url)
        wait_until(lambda: receiver.count() >= 1, 20, what="the callback")
        got = receiver.received[0]
    payload = verify_webhook(stack.webhook_secret, got.headers, got.body)
    assert payload["task_id"] == task.task_id and payload["status"] == "COMPLETED"
    assert ExportsClient.verify_webhook(stack.webhook_secret, got.headers, got.body) == payload
    assert swh.Webhook(stack.webhook_secret).verify(got.body, got.headers) == payload
    wrong = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    stale = webhooks.sign([stack.webhook_secret], "msg_1", got.body, timestamp=int(time.time()) - 301)
    refusals = {
        "tampered body": (stack.webhook_secret, got.headers, got.body.replace(b"COMPLETED", b"FAILED")),
        "wrong secret": (wrong, got.headers, got.body),
        "stale timestamp": (stack.webhook_secret, stale, got.body),
        **{f"missing {h}": (stack.webhook_secret, {k: v for k, v in got.headers.items() if k != h}, got.body)
           for h in ("webhook-id", "webhook-timestamp", "webhook-signature")},
    }
    for case, (secret, headers, body) in refusals.items():
        with pytest.raises(WebhookVerificationError):
            verify_webhook(secret, headers, body)
        with pytest.raises(swh.WebhookVerificationError):
            swh.Webhook(secret).verify(body, headers)
        assert not webhooks.verify(secret, headers, body), case


def test_verify_webhook_accepts_what_standardwebhooks_signs() -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    body = json.dumps({"task_id": "exp-20261129-aaaaaaaaaaaaaaaa", "status": "FAILED"})
    now = int(time.time())
    signature = swh.Webhook(secret).sign("msg_x", datetime.fromtimestamp(now, UTC), body)
    headers = {"Webhook-Id": "msg_x", "Webhook-Timestamp": str(now), "Webhook-Signature": f"v1,bad {signature}"}
    assert verify_webhook(secret, headers, body.encode())["status"] == "FAILED"


# -- one source for the task contract, and an SDK that stands alone --------------------------------


def _schema_types(hint: Any) -> set[str]:
    names = {str: "string", int: "integer", bool: "boolean", type(None): "null"}
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return {names.get(a, f"#/components/schemas/{getattr(a, '__name__', a)}") for a in args}


def _openapi_types(schema: dict[str, Any], schemas: dict[str, Any]) -> set[str]:
    if "$ref" in schema:
        target = schemas[schema["$ref"].rsplit("/", 1)[1]]
        return {target["type"]} if "enum" in target else {schema["$ref"]}  # an enum is its values' type
    for union in ("oneOf", "anyOf"):
        if union in schema:
            return set().union(*(_openapi_types(s, schemas) for s in schema[union]))
    kind = schema.get("type", "string")
    return set(kind) if isinstance(kind, list) else {kind}


@pytest.mark.parametrize("model,name", [(Task, "Task"), (Result, "Result"), (TaskError, "TaskError"),
                                        (CallbackState, "CallbackState")])
def test_models_match_the_gateways_live_openapi(stack: ClientStack, model: type, name: str) -> None:
    schemas = httpx.get(f"{stack.gateway.url}/openapi.json").json()["components"]["schemas"]
    schema = schemas[name]
    hints = typing.get_type_hints(model)
    fields = {f.name for f in dataclasses.fields(model)} - {"extra"}  # extra: what a newer gateway adds
    assert fields == set(schema["properties"]), f"{name}: fields differ from the gateway's schema"
    for field in fields:
        expected = _openapi_types(schema["properties"][field], schemas)
        if field not in schema.get("required", []):
            expected.add("null")  # optional in the document: None when absent
        assert _schema_types(hints[field]) == expected, (name, field)


def test_the_sdks_statuses_are_the_gateways_and_formats_are_each_types_own(stack: ClientStack) -> None:
    schemas = httpx.get(f"{stack.gateway.url}/openapi.json").json()["components"]["schemas"]
    assert schemas["Status"]["enum"] == list(STATUSES)
    # no fixed list of formats anywhere: the shape of a name, and each type's own list in its submit schema
    assert "enum" not in schemas["Result"]["properties"]["format"] and "Format" not in schemas
    assert schemas["Submit_report_export"]["properties"]["format"] == {"type": "string", "enum": ["csv", "jsonl"],
                                                                        "default": "csv"}


def test_openapi_types_the_filters_of_each_export_type(stack: ClientStack) -> None:
    doc = httpx.get(f"{stack.gateway.url}/openapi.json").json()
    schemas = doc["components"]["schemas"]
    union = schemas["SubmitRequest"]
    assert union["discriminator"]["propertyName"] == "export_type"
    assert "#/components/schemas/Submit_order_export" in union["discriminator"]["mapping"].values()
    order = schemas["Submit_order_export"]["properties"]
    assert order["export_type"] == {"type": "string", "const": "order_export"}
    filters = schemas["Filters_order_export"]
    assert filters["additionalProperties"] is False
    assert filters["properties"]["date_from"]["format"] == "date"
    assert filters["properties"]["user_id"]["type"] == "integer"
    assert "/api/v1/export-types" in doc["paths"]
    with client(stack) as c:
        live = {t.export_type: t.filters_schema for t in c.export_types()}
    assert live["order_export"] == filters


def test_export_types_needs_an_api_key(stack: ClientStack) -> None:
    resp = httpx.get(f"{stack.gateway.url}/api/v1/export-types")
    assert resp.status_code == 401 and resp.json()["code"] == 40100


def test_the_sdk_imports_nothing_from_the_server_packages() -> None:
    blocked = ["gateway", "backend_stub", "exports_common", "pydantic", "starlette", "aiohttp", "redis"]
    code = (
        "import sys\n"
        f"blocked = {blocked!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in blocked: raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import exports_client, exports_client.cli, exports_client.aio\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    allowed = set(sys.stdlib_module_names) | {"httpx", "rich", "standardwebhooks", "exports_client"}
    for path in (ROOT / "exports_client").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] in allowed | {"__future__"}, f"{path.name} imports {name}"


# -- the timing policy on a simulated clock -----------------------------------------------------------


class SimulatedGateway:
    """Answers status polls as the gateway does (Retry-After 1 s doubling to 30 s by age), on a fake clock."""

    def __init__(self, duration: float, outage: tuple[float, float] | None = None) -> None:
        self.clock = SimClock()
        self.start = self.clock.t
        self.duration = duration
        self.outage = outage
        self.polls: list[float] = []
        self.answers: list[tuple[float, int, float]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        age = self.clock.t - self.start
        self.polls.append(age)
        if self.outage and self.outage[0] <= age < self.outage[1]:
            self.answers.append((age, 503, 5))
            return httpx.Response(503, headers={"Retry-After": "5"},
                                  json={"code": 50300, "message": "down", "data": None})
        done = age >= self.duration
        task = {"task_id": request.url.path.rsplit("/", 1)[1], "status": "COMPLETED" if done else "RUNNING",
                "progress": 100 if done else int(100 * age / self.duration)}
        retry_after = 0 if done else gateway_retry_after(age)
        self.answers.append((age, 200, retry_after))
        return httpx.Response(200, headers={} if done else {"Retry-After": str(retry_after)},
                              json={"code": 0, "message": "success", "data": task})


def test_polling_cost_and_herd_meet_their_goals_on_a_simulated_clock() -> None:
    for duration in (5, 60, 300):
        row = polling_cost(duration, runs=20, seed=1)
        assert row.max_late_sec <= 30.0, row
        if duration == 300:
            assert row.ratio <= 0.25, row
    result = herd(clients=500, seed=2)
    assert result.peak_per_sec <= 2 * result.mean_per_sec, result


def test_jitter_stays_within_its_bounds_and_a_refusal_never_speeds_a_client_up() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        assert 10.0 <= polling.honour(10, rng) <= 12.0
        assert polling.honour(30, rng) == 30.0            # the ceiling: a finished task is seen within 30 s
        assert 60.0 <= polling.honour(60, rng) <= 72.0    # the gateway asked for more: honoured, jittered
        step = rng.randrange(0, 8)
        assert 1.0 <= polling.full_jitter(step, rng) <= min(30.0, 2.0 ** step)
        plan = polling.PollPlan("t", 1e9, rng, pace=rng.uniform(1, 30))
        pace = plan.pace
        plan.refused(0.0, rng.choice([None, 1.0, 5.0]))
        assert plan.not_before >= pace
