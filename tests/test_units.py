"""Small pure pieces: address policy spellings, poll intervals, routing, signing, task ids."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from backend_stub import compression
from backend_stub.formats import FORMATS
from exports_common import contract, webhooks
from exports_common.backoff import backoff, retry_after_seconds
from exports_common.errors import ApiError
from exports_common.list_query import ListQuery, check_list_query
from exports_common.netpolicy import AddressPolicy, refusal
from exports_common.otel import TracingConfig
from exports_common.periodic import periodic, running
from exports_common.signing import DownloadSigner
from exports_common.task_ids import is_task_id, new_task_id
from gateway import telemetry
from gateway.breakers import Breaker, guarded
from gateway.config import RouteConfig
from gateway.plugins.status_cache import poll_interval
from gateway.response import GatewayResponse
from gateway.router import Router
from gateway.tenants import TenantDirectory, hash_key
from gateway.upstream import UpstreamError

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://127.1/", "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/",
    "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.0.1/",
    "http://169.254.169.254/", "http://0.0.0.0/", "http://[fe80::1]/", "http://[fc00::1]/", "http://localhost/",
    "http://224.0.0.1/",
])
def test_non_public_addresses_are_refused_in_every_spelling(url: str) -> None:
    assert asyncio.run(refusal(url, AddressPolicy())) is not None


def test_public_and_allow_listed_addresses_pass() -> None:
    assert asyncio.run(refusal("http://8.8.8.8/cb", AddressPolicy())) is None
    allow = AddressPolicy.from_lists(["hooks.internal"], ["127.0.0.0/8"])
    assert asyncio.run(refusal("http://127.0.0.1:9000/cb", allow)) is None
    assert asyncio.run(refusal("http://localhost:9000/cb", allow)) is None
    assert asyncio.run(refusal("http://hooks.internal/cb", allow)) is None
    assert asyncio.run(refusal("http://10.0.0.1/cb", allow)) is not None


@pytest.mark.parametrize("age,expected", [(0, 1), (1.9, 1), (2, 2), (3.9, 2), (4, 4), (15, 8), (16, 16), (31, 16),
                                          (32, 30), (10_000, 30)])
def test_poll_interval_doubles_with_age_up_to_30(age: float, expected: int) -> None:
    assert poll_interval(age, 1, 30) == expected


def test_router_matches_params_and_reports_allowed_methods() -> None:
    routes = [RouteConfig(name="get", path="/a/{id}", methods=["GET"], upstream="u", rewrite="/b/{id}"),
              RouteConfig(name="cancel", path="/a/{id}/cancel", methods=["POST"], upstream="u")]
    router = Router(routes)
    match = router.match("GET", "/a/42")
    assert not isinstance(match, list) and match.params == {"id": "42"} and match.upstream_path("/a/42") == "/b/42"
    assert router.match("DELETE", "/a/42") == ["GET"]
    assert router.match("GET", "/a/42/x") == []
    head = router.match("HEAD", "/a/1")
    assert not isinstance(head, list) and head.route.name == "get"


@given(st.text(alphabet="ab.%?/:@-_~", min_size=1, max_size=12), st.text(alphabet="ab./-", min_size=1, max_size=12))
def test_the_upstream_path_is_the_same_whichever_way_it_is_made(value: str, tail: str) -> None:
    """A plain path's upstream path is the rewrite formatted with its params as they are; any other path's is made
    param by param: both give what `fill` gives, and a dot segment is a 404 either way."""
    from gateway.path_params import encode_segments, fill, multi_segment_params

    routes = [RouteConfig(name="one", path="/a/{id}", methods=["GET"], upstream="u", rewrite="/b/{id}/c"),
              RouteConfig(name="many", path="/p/{id}/{rest:path}", methods=["GET"], upstream="u",
                          rewrite="/q/{rest}/{id}"),
              RouteConfig(name="raw", path="/r/{rest:path}", methods=["GET"], upstream="u")]
    router = Router(routes)
    for path in (f"/a/{value}", f"/p/{value}/{tail}", f"/r/{value}/{tail}"):
        match = router.match("GET", path)
        if isinstance(match, list):
            continue
        rewrite = match.route.rewrite
        try:
            expected = (fill(rewrite, match.params, multi_segment_params(match.route.path)) if rewrite
                        else encode_segments(path, keep_slash=True))
        except ApiError:
            with pytest.raises(ApiError):
                match.upstream_path(path)
            continue
        assert match.upstream_path(path) == expected


def test_signing_rotation() -> None:
    old = DownloadSigner(["old-secret-0123456789"])
    rotated = DownloadSigner(["new-secret-0123456789", "old-secret-0123456789"])
    sig = old.sign("exp-20260101-aaaaaaaaaaaaaaaa", 100)
    assert rotated.verify("exp-20260101-aaaaaaaaaaaaaaaa", 100, sig)
    assert not rotated.verify("exp-20260101-aaaaaaaaaaaaaaaa", 101, sig)
    assert not DownloadSigner(["new-secret-0123456789"]).verify("exp-20260101-aaaaaaaaaaaaaaaa", 100, sig)


def test_task_ids_are_unique_and_match_the_contract() -> None:
    ids = {new_task_id("exp") for _ in range(10_000)}
    assert len(ids) == 10_000 and all(is_task_id(i) for i in ids)
    assert is_task_id(new_task_id("report2"))
    assert not is_task_id("exp-20260101-short")


def test_the_docs_callback_verification_example_runs() -> None:
    readme = (Path(__file__).resolve().parent.parent / "docs" / "clients" / "webhooks.md").read_text()
    example = re.search(r"Verifying a callback.*?```python\n(.*?)```", readme, re.S)
    assert example is not None
    exec(compile(example.group(1), "docs/clients/webhooks.md", "exec"), {})


def test_webhook_signatures_reject_tampering_replay_and_other_secrets() -> None:
    secret, other = "whsec_iCl0WN940QaVoCJovUTAq++Q04VVO3U5", "whsec_H5dBebRJnn8aiSa6bctI1Ge4mSV9g9vM"
    body = b'{"task_id":"x"}'
    headers = webhooks.sign([other, secret], "msg_1", body)
    assert webhooks.verify(secret, headers, body) and webhooks.verify(other, headers, body)
    assert not webhooks.verify(secret, headers, body + b"x")
    assert not webhooks.verify(secret, dict(headers, **{"webhook-id": "msg_2"}), body)
    stale = webhooks.sign([secret], "msg_1", body, timestamp=int(headers["webhook-timestamp"]) - 301)
    assert not webhooks.verify(secret, stale, body)
    assert not webhooks.verify("whsec_" + "A" * 32, headers, body)


@pytest.mark.inprocess
@pytest.mark.parametrize("stamp", ["9" * 400, "1" * 13, "+1700000000", "1_700_000_000", " 1700000000",
                                   "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660", "1e9",
                                   "-1", "9" * 5000])
def test_webhook_verifiers_refuse_a_timestamp_that_is_not_unix_seconds(stamp: str) -> None:
    """Unauthenticated input: a long number used to raise OverflowError from both verifiers."""
    from exports_client import WebhookVerificationError, verify_webhook

    secret = "whsec_iCl0WN940QaVoCJovUTAq++Q04VVO3U5"
    body = b'{"task_id":"x"}'
    headers = webhooks.sign([secret], "msg_1", body) | {"webhook-timestamp": stamp}
    assert webhooks.verify(secret, headers, body) is False
    with pytest.raises(WebhookVerificationError, match="not a Unix time in whole seconds"):
        verify_webhook(secret, headers, body)
    good = webhooks.sign([secret], "msg_1", body)
    assert webhooks.verify(secret, good, body) and verify_webhook(secret, good, body) == {"task_id": "x"}


@pytest.mark.inprocess
@pytest.mark.parametrize("offered", ["v1", "v1,abc", "v1,a,b", "v1,\u00e9\u00e9\u00e9\u00e9", ",", "", "v2,AAAA"])
def test_webhook_verifiers_refuse_a_malformed_signature_entry(offered: str) -> None:
    """Unauthenticated input the library would raise ValueError on (no comma, bad base64): a refusal, not a crash."""
    from exports_client import WebhookVerificationError, verify_webhook

    secret = "whsec_iCl0WN940QaVoCJovUTAq++Q04VVO3U5"
    body = b'{"task_id":"x"}'
    good = webhooks.sign([secret], "msg_1", body)
    headers = good | {"webhook-signature": offered}
    assert webhooks.verify(secret, headers, body) is False
    with pytest.raises(WebhookVerificationError, match=r"no signature matches|missing"):
        verify_webhook(secret, headers, body)
    # the SDK checks each entry apart: a good one next to a malformed one still passes
    both = good | {"webhook-signature": f"{offered} {good['webhook-signature']}"}
    assert verify_webhook(secret, both, body) == {"task_id": "x"}


@pytest.mark.inprocess
def test_webhook_verifiers_refuse_a_body_that_is_not_utf8_and_name_a_bad_secret() -> None:
    from exports_client import WebhookVerificationError, verify_webhook

    secret = "whsec_iCl0WN940QaVoCJovUTAq++Q04VVO3U5"
    headers = webhooks.sign([secret], "msg_1", b"{}")
    assert webhooks.verify(secret, headers, b"\xff\xfe") is False
    with pytest.raises(WebhookVerificationError, match="not UTF-8"):
        verify_webhook(secret, headers, b"\xff\xfe")
    for bad, problem in (("whsec_", "empty"), ("whsec_abcde", "not 'whsec_' and base64"), ("\u00e9", "base64")):
        with pytest.raises(WebhookVerificationError, match=problem):
            verify_webhook(bad, headers, b"{}")


async def _call_in_flight(breaker: Breaker, answer: asyncio.Future[GatewayResponse]) -> asyncio.Task[GatewayResponse]:
    """A call through `breaker` that waits for `answer`."""
    started = asyncio.Event()

    async def call() -> GatewayResponse:
        started.set()
        return await answer

    task = asyncio.create_task(guarded(breaker, call, frozenset({503})))
    await started.wait()
    return task


async def _cancelled(task: asyncio.Task[GatewayResponse]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_request_is_no_failure_and_a_trial_runs_to_its_end_to_decide() -> None:
    metrics, _ = telemetry.setup("test", TracingConfig())
    breaker = Breaker("u", fail_max=1, reset_timeout=0.05, metrics=metrics)
    loop = asyncio.get_running_loop()

    await _cancelled(await _call_in_flight(breaker, loop.create_future()))
    assert breaker.state == "closed"  # fail_max 1: counted as a failure, it would have opened the breaker

    async def reset() -> GatewayResponse:
        raise UpstreamError("reset", "connection reset by the upstream")

    with pytest.raises(UpstreamError):
        await guarded(breaker, reset, frozenset({503}))
    assert breaker.state == "open"
    deadline = loop.time() + 5
    while breaker.seconds_to_trial() > 0 and loop.time() < deadline:
        await asyncio.sleep(0.01)

    answer: asyncio.Future[GatewayResponse] = loop.create_future()
    await _cancelled(await _call_in_flight(breaker, answer))
    assert breaker.state == "half-open" and breaker.trial_in_flight  # the trial goes on without its request
    with pytest.raises(UpstreamError) as refused:
        await guarded(breaker, lambda: answer, frozenset({503}))
    assert refused.value.kind == "circuit_open"

    released = asyncio.Event()
    answer.set_result(GatewayResponse(200, release=released.set))
    await asyncio.wait_for(released.wait(), 5)  # nobody reads the trial's answer: its connection goes back
    assert breaker.state == "closed"
    assert not breaker.trial_in_flight


async def test_one_tenants_failure_statuses_open_its_own_breaker_two_tenants_open_the_shared_one() -> None:
    metrics, _ = telemetry.setup("test", TracingConfig())
    breaker = Breaker("u", fail_max=3, reset_timeout=30, metrics=metrics)

    async def failing() -> GatewayResponse:
        return GatewayResponse(500)

    async def fine() -> GatewayResponse:
        return GatewayResponse(200)

    for _ in range(3):
        assert (await guarded(breaker, failing, frozenset({500}), "a")).status == 500
    with pytest.raises(ApiError) as refused:
        await guarded(breaker, fine, frozenset({500}), "a")
    assert refused.value.kind.status == 503 and refused.value.data == {"reason": "tenant_circuit_open"}
    assert breaker.state == "closed" and breaker.describe()["tenants"]["a"]["state"] == "open"  # type: ignore[index]
    assert (await guarded(breaker, fine, frozenset({500}), "b")).status == 200

    for _ in range(3):  # a second tenant failing too: now the upstream looks unwell
        await guarded(breaker, failing, frozenset({500}), "b")
    assert breaker.state == "open"


async def test_a_backend_answering_503_to_everyone_is_a_shared_fault_not_the_one_calling_tenants() -> None:
    metrics, _ = telemetry.setup("test", TracingConfig())
    breaker = Breaker("u", fail_max=3, reset_timeout=30, metrics=metrics)
    statuses = frozenset({500, 502, 503, 504})

    async def unavailable_() -> GatewayResponse:
        return GatewayResponse(503)

    async def fine() -> GatewayResponse:
        return GatewayResponse(200)

    # one tenant alone meets a backend whose store is down: its answers pass on (the outbox takes a
    # submit's), and neither its own breaker nor the shared one opens on one tenant's evidence
    for _ in range(10):
        assert (await guarded(breaker, unavailable_, statuses, "a")).status == 503
    assert breaker.state == "closed" and "a" not in breaker.describe()["tenants"]  # type: ignore[operator]
    # a second tenant sees it too: the upstream is unwell for everyone, and the shared breaker opens
    for _ in range(3):
        await guarded(breaker, unavailable_, statuses, "b")
    assert breaker.state == "open"
    with pytest.raises(UpstreamError) as refused:  # the upstream's refusal: degradation (outbox, stale) applies
        await guarded(breaker, fine, statuses, "a")
    assert refused.value.kind == "circuit_open"

    # while another tenant is served, the same 503s to one tenant are that tenant's own
    other = Breaker("v", fail_max=3, reset_timeout=30, metrics=metrics)
    assert (await guarded(other, fine, statuses, "b")).status == 200
    for _ in range(3):
        await guarded(other, unavailable_, statuses, "a")
    with pytest.raises(ApiError) as own:
        await guarded(other, fine, statuses, "a")
    assert own.value.data == {"reason": "tenant_circuit_open"} and other.state == "closed"


# -- the task contract ------------------------------------------------------------------------------


def test_a_signed_link_carries_what_its_verifier_reads() -> None:
    signer = DownloadSigner(["s" * 32])
    link = urlsplit(contract.signed_link(signer, "https://gw.example", "exp-20261129-aaaaaaaaaaaaaaaa",
                                         time.time() + 60))
    assert link.path == "/api/v1/exports/exp-20261129-aaaaaaaaaaaaaaaa/download"
    expires, sig = contract.link_params(parse_qsl(link.query))
    assert expires is not None and sig is not None
    assert signer.verify("exp-20261129-aaaaaaaaaaaaaaaa", expires, sig)
    assert not signer.verify("exp-20261129-bbbbbbbbbbbbbbbb", expires, sig)
    assert contract.link_params([("expires", str(expires)), ("expires", str(expires)), ("sig", sig)]) == (None, sig)


@pytest.mark.parametrize("status,error,cause", [
    ("TIMEOUT", None, "TIMEOUT"), ("FAILED", {"retryable": True}, "FAILED_RETRYABLE"),
    ("FAILED", {"retryable": False}, None), ("FAILED", None, None), ("COMPLETED", None, None),
    ("CANCELLED", None, None)])
def test_which_finished_tasks_may_run_again(status: str, error: dict[str, Any] | None, cause: str | None) -> None:
    assert contract.rerun_cause(status, error) == cause


def test_a_task_answer_leaves_out_what_is_not_known_and_refuses_a_bad_status() -> None:
    now = "2026-11-29T00:00:00Z"
    fields = dict(task_id="exp-20261129-aaaaaaaaaaaaaaaa", export_type=None, progress=0, current_step=None,
                  attempt=1, created_at=now, updated_at=now, result=None, error=None, degraded=True, callback=None)
    answer = contract.Task(status="PENDING", **fields).answer()
    assert answer["status"] == "PENDING" and "reruns" not in answer and answer["current_step"] is None
    with pytest.raises(ValidationError):
        contract.Task(status="DONE", **fields)


def test_the_document_lists_the_media_type_of_every_format_and_compression() -> None:
    served = {f.media_type.split(";")[0] for f in FORMATS.values()} | set(compression.MEDIA_TYPES.values())
    assert served == set(contract.RESULT_MEDIA_TYPES)
    assert all(contract.FORMAT_PATTERN.fullmatch(name) for name in FORMATS)


# -- background loops -----------------------------------------------------------------------------


async def test_a_loop_logs_an_expected_failure_once_without_traceback_and_its_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    recovered = asyncio.Event()

    async def step() -> None:
        calls.append(1)
        if len(calls) <= 20:
            raise ConnectionError("refused")
        if len(calls) == 22:
            recovered.set()

    with caplog.at_level(logging.INFO, logger="test.loop"):
        async with running(periodic("sweep", step, 0.001, logging.getLogger("test.loop"),
                                    expected={ConnectionError: "the store is down: start it"})) as tasks:
            await asyncio.wait_for(recovered.wait(), 10)
    assert tasks[0].cancelled(), "cancelling stops the loop"
    lines = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert lines == [("WARNING", "sweep failed: the store is down: start it", None),
                     ("INFO", "sweep works again", None)]
    assert caplog.records[1].failures == 20  # type: ignore[attr-defined]


async def test_a_loop_survives_an_unexpected_error_and_logs_its_traceback_once(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    done = asyncio.Event()

    async def step() -> None:
        calls.append(1)
        if len(calls) == 5:
            done.set()
        raise KeyError("surprise")

    with caplog.at_level(logging.INFO, logger="test.loop"):
        async with running(periodic("drain", step, 0.001, logging.getLogger("test.loop"))):
            await asyncio.wait_for(done.wait(), 10)
    assert [r.exc_info is not None for r in caplog.records] == [True]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([None, *contract.STATUSES]), st.integers(1, 500),
       st.one_of(st.none(), st.text(alphabet="AZaz09_-", min_size=1, max_size=40)))
def test_a_checked_list_query_encodes_to_a_query_that_checks_the_same(status: str | None, limit: int,
                                                                      cursor: str | None) -> None:
    query = ListQuery(status, limit, cursor)
    assert check_list_query(parse_qsl(query.encode(), keep_blank_values=True)) == query


def test_a_signed_link_is_the_hmac_of_its_task_and_expiry_under_the_first_secret() -> None:
    signer = DownloadSigner(["first", "second"])
    expected = hmac.new(b"first", b"exp-1:1764669600", hashlib.sha256).hexdigest()
    assert signer.sign("exp-1", 1764669600) == expected == signer.sign("exp-1", 1764669600)
    old = hmac.new(b"second", b"exp-1:1764669600", hashlib.sha256).hexdigest()
    assert signer.verify("exp-1", 1764669600, old) and not signer.verify("exp-2", 1764669600, old)


def test_only_keys_that_name_a_tenant_are_remembered_and_no_more_than_are_configured() -> None:
    """Remembered `Authorization` values skip the hash; what clients send must not grow that memory."""
    directory = TenantDirectory({"acme": [hash_key("k1")], "beta": [hash_key("k2")]})
    for header in (b"Bearer k1", b"bearer k1", b"Bearer  k1 ", b"BEARER k1", b"Bearer k1"):
        assert directory.bearer(header) == "acme"
    assert directory.bearer(b"Bearer k2") == "beta"
    remembered = directory._named.cache_info().currsize
    assert remembered == 2
    for n in range(5000):  # a flood of bogus values: each refused, none remembered
        assert directory.bearer(b"Bearer bogus-%d" % n) is None
        assert directory.bearer(b"Basic k1-%d" % n) is None
    assert directory.bearer(b"Basic k1") is None and directory.bearer(b"k1") is None
    assert directory._named.cache_info().currsize == remembered
    assert directory.bearer(b"Bearer k1") == "acme" and directory.bearer(b"Bearer k2") == "beta"
    for n in range(10):  # a tenant cycling spellings of its own key does not push another's out
        assert directory.bearer(b"Bearer " + b" " * n + b"k1") == "acme"
    hits = directory._named.cache_info().hits
    assert directory.bearer(b"Bearer k2") == "beta" and directory._named.cache_info().hits == hits + 1


@given(st.text(max_size=40))
def test_a_path_param_goes_upstream_as_one_segment_and_reads_back_as_sent(value: str) -> None:
    from urllib.parse import unquote

    from gateway.path_params import encode_segments

    if value in (".", ".."):
        with pytest.raises(ApiError):
            encode_segments(value, keep_slash=False)
        return
    segment = encode_segments(value, keep_slash=False)
    assert not set(segment) & set("/?#")  # cannot add a segment, start a query or cut the path
    assert unquote(segment) == value
    # a {name:path} param keeps its segments, each encoded on its own
    parts = encode_segments(f"{value.replace('.', 'x')}/a/b", keep_slash=True).split("/")
    assert parts[-2:] == ["a", "b"] and unquote("/".join(parts)) == f"{value.replace('.', 'x')}/a/b"


def test_retry_after_reads_delay_seconds_and_http_dates_and_nothing_else() -> None:
    assert retry_after_seconds(" 7 ") == 7.0
    assert retry_after_seconds("Wed, 02 Dec 2026 10:00:30 GMT", now=1796205600.0) == 30.0
    assert retry_after_seconds("Wed, 02 Dec 2026 09:00:00 GMT", now=1796205600.0) == 0.0
    assert [retry_after_seconds(v) for v in (None, "", "-1", "1.5", "soon", "\u00b2", "\u0663")] == [None] * 7


def test_backoff_grows_to_its_cap_within_its_jitter_and_survives_a_long_outage() -> None:
    for step, ceiling in ((0, 1.0), (3, 8.0), (5, 30.0), (5000, 30.0)):
        assert all(ceiling / 2 <= backoff(step, 1.0, 30.0) <= ceiling for _ in range(50))
        assert all(0.0 <= backoff(step, 1.0, 30.0, full_jitter=True) <= ceiling for _ in range(50))
