"""Nothing a client sends reaches a 5xx: every public parameter and body field, driven with hostile values.

One gateway and one backend serve the whole module. Property-based tests (hypothesis)
send full Unicode, lone surrogates, NUL, huge and non-finite numbers in every query
parameter, member name and value, to both processes over real sockets; each answer
must be a 4xx (or 2xx) JSON envelope, and neither log may hold a traceback. The
regression tests name the findings of the red-team review one by one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exports_common.task_ids import new_task_id
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import assert_envelope_error, backend_requests, wait_status
from tests.procs import SERVICE_TOKEN, Service, backend_headers, wait_until

GATEWAY_SENT = backend_headers("demo")  # what a gateway sends a backend: the service token and the tenant

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
# one client for the module: a fresh httpx client per request (SSL context and all) cost more than the servers did
HTTP = httpx.Client(timeout=20)


def fuzz(examples: int) -> settings:
    """Bounded, so the module adds about a minute to the suite; FUZZ_SCALE scales it for a longer run."""
    scale = float(os.environ.get("FUZZ_SCALE", "1"))
    return settings(max_examples=max(1, int(examples * scale)), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# every code point, lone surrogates and NUL included (hypothesis leaves surrogates out by default)
ANY_CHAR = st.characters(exclude_categories=[])
ANY_TEXT = st.text(ANY_CHAR, max_size=40)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.integers(min_value=10**300, max_value=10**4000),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 4400]),
)
DIGITS = st.sampled_from(["²", "٣", "\uff11\uff12", "1_0", " 5", "5 ", "+5", "-1", "0", "501", "0x10", "9" * 5000, "",
                          "\x00", "1\x00", "1.0", "1e2"])
# what an HTTP client can put in a header: Latin-1 without controls, no surrounding whitespace
LATIN1_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                      max_size=60).map(str.strip)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), ANY_TEXT, NUMBERS)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)), max_leaves=12)


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Service, Service]]:
    workdir = tmp_path_factory.mktemp("fuzz")
    config = backend_config(workdir)
    config["export_types"]["order_export"]["source"]["rows"] = 2000  # accepted fuzz submits really run: keep them small
    backend = module_services("backend_stub", config)
    gateway = module_services("gateway", gateway_config(workdir, backend.url))
    yield backend, gateway
    for service in (backend, gateway):
        assert "Traceback" not in service.log(), service.log()[-4000:]


def query_string(pairs: list[tuple[str, str]]) -> str:
    """Percent-encoded as UTF-8; a lone surrogate goes out as the bytes a careless client would send."""
    def enc(text: str) -> str:
        return quote(text.encode("utf-8", "surrogatepass"), safe="")
    return "&".join(f"{enc(k)}={enc(v)}" for k, v in pairs)


def json_text(value: Any) -> bytes:
    # ensure_ascii spells lone surrogates as \\udXXX escapes, which Python's parser (and the servers') accept
    return json.dumps(value, allow_nan=True).encode()


def assert_client_error_or_ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:500]
    body = resp.json()
    assert (body["code"] == 0) == (resp.status_code < 400), body
    return body


def get(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return HTTP.get(url, headers=headers or {})


def post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return HTTP.post(url, content=body, headers={"content-type": "application/json", **headers})


# -- property-based: every public parameter and body field ----------------------------------------------------


@fuzz(80)
@given(st.lists(st.tuples(st.one_of(st.sampled_from(["limit", "status", "cursor"]), ANY_TEXT),
                          st.one_of(DIGITS, ANY_TEXT)), max_size=4))
def test_list_query_never_reaches_a_5xx(stack: tuple[Service, Service], pairs: list[tuple[str, str]]) -> None:
    backend, gateway = stack
    qs = query_string(pairs)
    assert_client_error_or_ok(get(f"{gateway.url}/api/v1/exports?{qs}", AUTH))
    assert_client_error_or_ok(get(f"{backend.url}/exports?{qs}", GATEWAY_SENT))


@fuzz(50)
@given(st.lists(st.tuples(st.sampled_from(["expires", "sig", "x"]), st.one_of(DIGITS, ANY_TEXT)), max_size=4),
       st.one_of(st.just(new_task_id()), ANY_TEXT))
def test_download_link_never_reaches_a_5xx(stack: tuple[Service, Service], pairs: list[tuple[str, str]],
                                           task_id: str) -> None:
    _, gateway = stack
    path = quote(task_id.encode("utf-8", "surrogatepass"), safe="") or "x"
    resp = get(f"{gateway.url}/api/v1/exports/{path}/download?{query_string(pairs)}")
    assert 400 <= resp.status_code < 500
    assert_client_error_or_ok(resp)
    assert_client_error_or_ok(get(f"{gateway.url}/api/v1/exports/{path}?{query_string(pairs)}", AUTH))
    assert_client_error_or_ok(HTTP.post(f"{gateway.url}/api/v1/exports/{path}/cancel", headers=AUTH))


@pytest.fixture(scope="module")
def download_url(stack: tuple[Service, Service]) -> str:
    """A working signed link to a real result file, through the gateway."""
    _, gateway = stack
    task_id = post(f"{gateway.url}/api/v1/exports", b'{"export_type": "report_export"}', AUTH).json()["data"]["task_id"]
    task = wait_status(gateway.url, task_id, path="/api/v1/exports/", headers=AUTH)
    link = urlsplit(task["result"]["download_url"])
    return f"{gateway.url}{link.path}?{link.query}"


RANGE_SPECS = st.one_of(
    LATIN1_TEXT,
    st.lists(st.tuples(st.one_of(st.none(), st.integers(-5, 10**30)), st.one_of(st.none(), st.integers(-5, 10**30))),
             min_size=1, max_size=4).map(lambda parts: "bytes=" + ",".join(
                 f"{'' if a is None else a}-{'' if b is None else b}" for a, b in parts)),
)


@fuzz(50)
@given(RANGE_SPECS)
def test_download_range_never_reaches_a_5xx(download_url: str, spec: str) -> None:
    resp = HTTP.get(download_url, headers=[(b"range", spec.encode("latin-1"))])
    assert resp.status_code in (200, 206, 400, 416), (spec, resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        assert_client_error_or_ok(resp)


@fuzz(40)
@given(st.dictionaries(st.one_of(st.sampled_from(["export_type", "filters", "callback_url", "timeout_sec",
                                                  "format"]), ANY_TEXT),
                       JSON_VALUES, max_size=5),
       st.dictionaries(ANY_TEXT, st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=3)), max_size=4),
       st.sampled_from(["order_export", "user_export", "report_export", "nope"]))
def test_submit_body_never_reaches_a_5xx(stack: tuple[Service, Service], top: dict[str, Any],
                                         filters: dict[str, Any], export_type: str) -> None:
    backend, gateway = stack
    for body in ({"export_type": export_type, "filters": filters}, dict(top, export_type=export_type)):
        raw = json_text(body)
        assert_client_error_or_ok(post(f"{gateway.url}/api/v1/exports", raw, AUTH))
        assert_client_error_or_ok(post(f"{backend.url}/exports", raw,
                                       GATEWAY_SENT | {"X-Task-Id": new_task_id()}))


@fuzz(50)
@given(st.sampled_from(["idempotency-key", "x-request-id", "authorization", "traceparent", "range", "if-range",
                        "x-tenant-id", "x-task-id", "content-type"]), LATIN1_TEXT)
def test_headers_never_reach_a_5xx(stack: tuple[Service, Service], name: str, value: str) -> None:
    backend, gateway = stack
    raw = value.encode("latin-1")
    body = json_text({"export_type": "report_export"})
    headers = with_header({**AUTH, "content-type": "application/json"}, name, raw)
    assert_client_error_or_ok(HTTP.post(f"{gateway.url}/api/v1/exports", content=body, headers=headers))
    assert_client_error_or_ok(HTTP.get(f"{gateway.url}/api/v1/exports", headers=headers))
    direct = with_header({"X-Task-Id": new_task_id(), "X-Tenant-Id": "demo", "Authorization": f"Bearer {SERVICE_TOKEN}",
                          "content-type": "application/json"}, name, raw)
    assert_client_error_or_ok(HTTP.post(f"{backend.url}/exports", content=body, headers=direct))


def with_header(base: dict[str, str], name: str, value: bytes) -> list[tuple[bytes, bytes]]:
    """`base` with `name` set to raw bytes (replacing a header of that name)."""
    return [(k.encode(), v.encode()) for k, v in base.items() if k.lower() != name] + [(name.encode(), value)]


# -- the findings, one by one ---------------------------------------------------------------------------------


@pytest.mark.parametrize("member", ["\ud800", "a\udfffb", "\x00", "\U0010ffff"])
def test_odd_member_names_are_a_4xx_envelope(stack: tuple[Service, Service], member: str) -> None:
    backend, gateway = stack
    for body in ({member: 1, "export_type": "report_export"}, {"export_type": "report_export",
                                                               "filters": {member: 1}}):
        resp = post(f"{gateway.url}/api/v1/exports", json_text(body), AUTH)
        assert_envelope_error(resp, 422, 42200)
        direct = post(f"{backend.url}/exports", json_text(body), GATEWAY_SENT | {"X-Task-Id": new_task_id()})
        assert_envelope_error(direct, 422, 42200)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_non_finite_numbers_in_filters_are_refused(stack: tuple[Service, Service], number: str) -> None:
    backend, gateway = stack
    raw = b'{"export_type": "order_export", "filters": {"min_amount": ' + number.encode() + b"}}"
    body = assert_envelope_error(post(f"{gateway.url}/api/v1/exports", raw, AUTH), 422, 42200)
    assert body["data"]["field"] == "filters.min_amount"
    direct = post(f"{backend.url}/exports", raw, GATEWAY_SENT | {"X-Task-Id": new_task_id()})
    assert_envelope_error(direct, 422, 42200)


def test_bad_list_parameters_never_reach_the_backend_nor_its_breaker(stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    before = backend_requests(backend.url)
    for qs in ["limit=%C2%B2", "limit=" + "9" * 5000, "limit=0", "limit=1&limit=2", "status=nope",
               "cursor=%00", "cursor=" + "a" * 600, "tenant=demo2", "limit=%ED%A0%80"] * 2:
        assert_envelope_error(get(f"{gateway.url}/api/v1/exports?{qs}", AUTH), 422, 42200)
    assert backend_requests(backend.url) == before, "a refused list request never reaches the backend"
    breakers = get(f"{gateway.url}/admin/breakers", {"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["data"]
    assert breakers["exports"]["state"] == "closed"
    assert get(f"{gateway.url}/api/v1/exports?limit=2&status=COMPLETED", AUTH).status_code == 200


@pytest.mark.parametrize("qs", ["expires=%C2%B2&sig=ab", "expires=" + "9" * 5000 + "&sig=ab",
                                "expires=1&expires=2&sig=ab", "expires=1&sig=%ED%A0%80", "expires=%00&sig=%00",
                                "expires=\uff11\uff12&sig=ab", ""])
def test_malformed_download_links_are_403(stack: tuple[Service, Service], qs: str) -> None:
    _, gateway = stack
    assert_envelope_error(get(f"{gateway.url}/api/v1/exports/{new_task_id()}/download?{qs}"), 403, 40300)


def test_range_errors_are_envelopes(download_url: str) -> None:
    url = download_url
    assert HTTP.get(url, headers={"Range": "bytes=0-9"}).status_code == 206
    resp = HTTP.get(url, headers={"Range": "bytes=999999999-"})
    assert_envelope_error(resp, 416, 41600)
    assert resp.headers["content-range"].startswith("bytes */")
    assert_envelope_error(HTTP.get(url, headers={"Range": "bytes=abc"}), 400, 40002)
    whole = HTTP.get(url)
    for ignored in ("items=0-1", "bytes=5-1"):  # another unit, and a last byte before the first (RFC 9110 14)
        resp = HTTP.get(url, headers={"Range": ignored})
        assert resp.status_code == 200 and resp.content == whole.content, ignored


@pytest.mark.parametrize("host", ["a..b.example", "-bad.example", "x" * 64 + ".example", "bad_name.example",
                                  "exa mple.com"])
def test_callback_host_that_is_not_a_dns_name_is_422(stack: tuple[Service, Service], host: str) -> None:
    backend, gateway = stack
    body = json_text({"export_type": "report_export", "callback_url": f"https://{host}/hook"})
    assert_envelope_error(post(f"{gateway.url}/api/v1/exports", body, AUTH), 422, 42200)
    direct = post(f"{backend.url}/exports", body, GATEWAY_SENT | {"X-Task-Id": new_task_id()})
    assert_envelope_error(direct, 422, 42200)


def test_unknown_paths_and_methods_are_envelopes(stack: tuple[Service, Service]) -> None:
    backend, gateway = stack
    for url in (f"{gateway.url}/nope", f"{gateway.url}/admin/nope"):
        assert_envelope_error(get(url), 404, 40400)
    assert_envelope_error(get(f"{backend.url}/nope", GATEWAY_SENT), 404, 40400)
    assert_envelope_error(HTTP.delete(f"{gateway.url}/api/v1/exports", headers=AUTH), 405, 40500)
    assert_envelope_error(HTTP.delete(f"{backend.url}/exports", headers=GATEWAY_SENT), 405, 40500)
    assert_envelope_error(HTTP.post(f"{gateway.url}/healthz"), 405, 40500)


def test_stack_logged_no_traceback(stack: tuple[Service, Service]) -> None:
    for service in stack:
        assert "Traceback" not in service.log(), service.log()[-4000:]
    assert Path(stack[0].log_path).exists()


def test_upstream_dying_mid_download_cuts_the_body_without_a_traceback(services: Callable[..., Service],
                                                                       tmp_path: Path) -> None:
    # a file of about 20 MB: more than the socket buffers between the three parties hold
    mid = {"mid_export": synthetic_type("orders", 400_000, 9)}
    backend = services("backend_stub", backend_config(tmp_path, export_types=mid))
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    task_id = post(f"{gateway.url}/api/v1/exports", b'{"export_type": "mid_export"}', AUTH).json()["data"]["task_id"]
    link = urlsplit(wait_status(gateway.url, task_id, path="/api/v1/exports/", headers=AUTH,
                                timeout=60)["result"]["download_url"])
    got = 0
    with pytest.raises(httpx.RemoteProtocolError), \
            httpx.stream("GET", f"{gateway.url}{link.path}?{link.query}", timeout=20) as resp:
        for chunk in resp.iter_bytes():
            got += len(chunk)
            if got > 1_000_000:
                backend.kill()
    assert got < int(resp.headers["content-length"]), "the client sees the body cut short, not a whole file"
    wait_until(lambda: "stopped in the middle of a body" in gateway.log(), 10, what="the gateway's warning")
    assert "Traceback" not in gateway.log()
