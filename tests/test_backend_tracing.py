"""The backend's server spans as a collector sees them: a caller's `traceparent` read as W3C Trace Context says.

Its trace-flags are a bit field (only 0x01 means sampled); a header that is not well formed is ignored, and the
request is a new trace the backend's ratio decides on (1 here, so an ignored header shows as a root span).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from exports_common.task_ids import new_task_id
from tests import otlp_receiver
from tests.conftest import backend_config
from tests.otlp_receiver import OtlpReceiver, Span
from tests.procs import SERVICE_TOKEN, Service, backend_headers, wait_until
from tests.receiver import Receiver

CALLER_SPAN = "00f067aa0ba902b7"
ROUTE = "/exports/{task_id}"
SERVER = 2  # SpanKind.SERVER as OTLP numbers it


def _trace(n: int) -> str:
    return f"{n:x}bf92f3577b34da6a3ce929d0e0e473{n:x}"


# a task id per request, so that its span is found by its path
UNSAMPLED = {"flags-00": f"00-{_trace(1)}-{CALLER_SPAN}-00",
             "flags-02": f"00-{_trace(2)}-{CALLER_SPAN}-02"}  # another flag set, the sampled bit not
FOLLOWED = {"flags-03": f"00-{_trace(3)}-{CALLER_SPAN}-03",  # the sampled bit and another one
            "version-01": f"01-{_trace(4)}-{CALLER_SPAN}-01-more",  # a later version may add fields
            "sampled": f"00-{_trace(5)}-{CALLER_SPAN}-01"}
IGNORED = {"uppercase": f"00-{_trace(6).upper()}-{CALLER_SPAN.upper()}-01",
           "version-ff": f"ff-{_trace(7)}-{CALLER_SPAN}-01",
           "version-00-with-more": f"00-{_trace(8)}-{CALLER_SPAN}-01-more",
           "zero-trace-id": f"00-{'0' * 32}-{CALLER_SPAN}-00",
           "zero-span-id": f"00-{_trace(9)}-{'0' * 16}-01",
           "not-a-traceparent": "not-a-traceparent-00"}


def _get(backend: Service, task_id: str, traceparent: str) -> None:
    answer = httpx.get(f"{backend.url}/exports/{task_id}", timeout=10,
                       headers=backend_headers("t1", traceparent=traceparent))
    assert answer.status_code == 404, answer.text


def _traced_backend(services: Callable[..., Service], tmp_path: Path, collector: OtlpReceiver,
                    **env: str) -> Service:
    """The export service sending its spans to `collector` at once (100 ms batches), with `env` set too."""
    return services("backend_stub", backend_config(tmp_path), OTEL_TRACES_EXPORTER="otlp",
                    OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="100", **env)


def test_the_sampled_bit_alone_decides_and_a_malformed_traceparent_is_ignored(
        services: Callable[..., Service], tmp_path: Path) -> None:
    with OtlpReceiver() as collector:
        backend = _traced_backend(services, tmp_path, collector, OTEL_TRACES_SAMPLER_ARG="1")
        for task_id, traceparent in (UNSAMPLED | IGNORED | FOLLOWED).items():  # "sampled" last: its span the last
            _get(backend, task_id, traceparent)

        def by_path() -> dict[str, list[Span]] | None:
            spans: dict[str, list[Span]] = {}
            for span in collector.spans:
                spans.setdefault(span.attributes.get("url.path", ""), []).append(span)
            # the spans are exported in the order they ended: once the last request's is in, all are
            return spans if "/exports/sampled" in spans else None

        spans = wait_until(by_path, 15, what="the last request's span")
    for task_id in UNSAMPLED:
        assert f"/exports/{task_id}" not in spans, f"{task_id}: the sampled bit is not set, nothing is recorded"
    for task_id, traceparent in FOLLOWED.items():
        [span] = spans[f"/exports/{task_id}"]
        assert (span.trace_id, span.parent_id) == (traceparent.split("-")[1], CALLER_SPAN), task_id
    for task_id, traceparent in IGNORED.items():
        [span] = spans[f"/exports/{task_id}"]
        assert span.parent_id == "" and span.trace_id not in traceparent.lower(), f"{task_id}: a new trace"
    [span] = spans["/exports/sampled"]
    assert (span.name, span.kind) == (f"GET {ROUTE}", SERVER)
    assert {k: span.attributes.get(k) for k in ("http.route", "http.request.method", "http.response.status_code")} \
        == {"http.route": ROUTE, "http.request.method": "GET", "http.response.status_code": 404}


def test_a_task_keeps_a_well_formed_traceparent_only(services: Callable[..., Service], tmp_path: Path) -> None:
    """With tracing off the task keeps its caller's `traceparent` for the callback: only one W3C would accept."""
    backend = services("backend_stub", backend_config(tmp_path, callbacks={"allow_networks": ["127.0.0.0/8"]}))
    kept, refused = f"00-{_trace(10)}-{CALLER_SPAN}-02", f"ff-{_trace(11)}-{CALLER_SPAN}-01"
    with Receiver() as receiver:
        for count, traceparent in enumerate((refused, kept), start=1):  # one at a time: the callbacks in order
            headers = backend_headers("demo", traceparent=traceparent, **{"X-Task-Id": new_task_id()})
            created = httpx.post(f"{backend.url}/exports", headers=headers, timeout=10,
                                 json={"export_type": "report_export", "callback_url": receiver.url})
            assert created.status_code == 201, created.text
            wait_until(lambda n=count: receiver.count() == n, 15, what="the callback")  # type: ignore[misc]
    assert [r.headers.get("traceparent") for r in receiver.received] == [None, kept]


def test_a_sampler_not_parent_based_records_under_an_unsampled_caller(services: Callable[..., Service],
                                                                      tmp_path: Path) -> None:
    with OtlpReceiver() as collector:
        backend = _traced_backend(services, tmp_path, collector, OTEL_TRACES_SAMPLER="always_on")
        _get(backend, "flags-00", UNSAMPLED["flags-00"])
        span = wait_until(lambda: next((s for s in collector.spans if s.trace_id == _trace(1)), None), 15,
                          what="the request's span")
    assert (span.name, span.parent_id) == (f"GET {ROUTE}", CALLER_SPAN)


SECRET_QUERY = "expires=1999999999&sig=SECRETSIG&token=SECRETTOK&X-Amz-Signature=AMZSIG&BARESECRET"
NAMES_ONLY = "expires=REDACTED&sig=REDACTED&token=REDACTED&X-Amz-Signature=REDACTED&REDACTED"


def _with_arrays(value: AnyValue) -> Any:
    """The collector's attribute value, a captured header's list of strings read too (it keeps scalars only)."""
    if value.WhichOneof("value") == "array_value":
        return [item.string_value for item in value.array_value.values]
    return getattr(value, value.WhichOneof("value") or "string_value")


@pytest.mark.parametrize("semconv", ["http", "http/dup"])  # "http/dup": the old `http.target`, `http.url` too
def test_a_span_keeps_a_query_s_names_only_and_no_header_s_secret(
        services: Callable[..., Service], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, semconv: str) -> None:
    monkeypatch.setattr(otlp_receiver, "_value", _with_arrays)
    with OtlpReceiver() as collector:
        backend = _traced_backend(services, tmp_path, collector, OTEL_TRACES_SAMPLER_ARG="1",
                                  OTEL_SEMCONV_STABILITY_OPT_IN=semconv,
                                  OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=".*")
        httpx.get(f"{backend.url}/exports/secret/file?{SECRET_QUERY}", timeout=10,
                  headers=backend_headers("t1", traceparent=FOLLOWED["sampled"]))
        span = wait_until(lambda: next((s for s in collector.spans if s.trace_id == _trace(5)), None), 15,
                          what="the request's span")
    assert span.attributes["url.query"] == NAMES_ONLY
    assert span.attributes["http.request.header.authorization"] == ["[REDACTED]"]
    if semconv == "http/dup":
        assert span.attributes["http.target"] == f"/exports/secret/file?{NAMES_ONLY}"
        assert span.attributes["http.url"].endswith(f"/exports/secret/file?{NAMES_ONLY}")
    exported = repr(span.attributes)
    for secret in ("1999999999", "SECRETSIG", "SECRETTOK", "AMZSIG", "BARESECRET", SERVICE_TOKEN):
        assert secret not in exported, secret


def test_a_caller_without_the_service_token_makes_no_span(services: Callable[..., Service],
                                                           tmp_path: Path) -> None:
    with OtlpReceiver() as collector:
        backend = _traced_backend(services, tmp_path, collector, OTEL_TRACES_SAMPLER_ARG="1")
        refused = httpx.get(f"{backend.url}/exports/anyone?{SECRET_QUERY}", timeout=10,
                            headers={"traceparent": FOLLOWED["flags-03"], "X-Tenant-Id": "t1"})
        assert refused.status_code == 401, refused.text
        # a probe, open to all, still makes its span: once it is in, the refused request's would be too
        httpx.get(f"{backend.url}/readyz", timeout=10, headers={"traceparent": FOLLOWED["sampled"]})
        wait_until(lambda: any(s.trace_id == _trace(5) for s in collector.spans), 15, what="the probe's span")
        assert [s.name for s in collector.spans if s.trace_id == _trace(3)] == []
