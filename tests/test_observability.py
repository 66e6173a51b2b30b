"""What an SRE sees: one trace per task in a collector, metrics from start-up, the access log, quiet logs."""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.helpers import wait_status
from tests.otlp_receiver import OtlpReceiver, Span
from tests.procs import Service, backend_headers, wait_until
from tests.receiver import Receiver

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LOOPBACK = {"allow_networks": ["127.0.0.0/8"]}


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` whose labels include `labels`, or None if there is none."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if series.split("{")[0] == name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def scrape(service: Service) -> str:
    resp = httpx.get(f"{service.url}/metrics", timeout=10,
                     headers=backend_headers() if service.module == "backend_stub" else {})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return resp.text


def _child(spans: list[Span], parent: Span, name_prefix: str, service: str) -> Span:
    found = [s for s in spans if s.parent_id == parent.span_id and s.name.startswith(name_prefix)
             and s.service == service]
    assert found, (f"no {service} span {name_prefix!r} under {parent.name!r}",
                   [(s.service, s.name, s.parent_id) for s in spans])
    return found[0]


def test_a_task_is_one_trace_from_client_to_callback(services: Callable[..., Service], tmp_path: Path) -> None:
    with OtlpReceiver() as collector, Receiver() as hook:
        # the backend from OpenTelemetry's variables, the gateway from its YAML: both ways must work
        backend = services("backend_stub", backend_config(tmp_path, callbacks=LOOPBACK),
                           OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
                           OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_SERVICE_NAME="export-backend",
                           OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
        gateway = services("gateway", gateway_config(tmp_path, backend.url, tracing={
            "exporter": "otlp", "endpoint": collector.url, "sample_ratio": 0, "trusted_proxies": ["127.0.0.0/8"]}))
        trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        created = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export", "callback_url": hook.url},
                             headers=AUTH | {"traceparent": f"00-{trace_id}-{client_span}-01"}, timeout=10)
        assert created.status_code == 202, created.text
        task_id = created.json()["data"]["task_id"]
        wait_status(gateway.url, task_id, {"COMPLETED"}, path=f"{API}/", headers=AUTH)
        wait_until(lambda: hook.count() == 1, 15, what="the callback")
        assert hook.received[0].headers["traceparent"].split("-")[1] == trace_id

        def whole_trace() -> list[Span] | None:
            spans = collector.of_trace(trace_id)
            names = {s.name for s in spans}
            # each process exports in its own batches: wait for the gateway's spans as well as the backend's
            return spans if {"callback", "export report_export", "POST /exports", f"POST {API}"} <= names else None

        spans = wait_until(whole_trace, 20, what="every hop's span in the collector")
    server = next(s for s in spans if s.service == "gateway" and s.name == f"POST {API}")
    assert server.parent_id == client_span
    attempt = _child(spans, server, "upstream exports", "gateway")
    assert attempt.attributes["gateway.attempt"] == 1 and attempt.attributes["gateway.breaker.state"] == "closed"
    backend_server = _child(spans, attempt, "POST /exports", "export-backend")
    export = _child(spans, backend_server, "export report_export", "export-backend")
    assert export.attributes["export.attempt"] == 1 and export.attributes["export.status"] == "COMPLETED"
    assert export.attributes["export.rows"] > 0 and export.attributes["export.task_id"] == task_id
    steps = [e[1]["export.step"] for e in export.events if e[0] == "step"]  # as progress reports find them
    assert steps[0] == "query" and steps == sorted(steps, key=["query", "render", "store"].index), steps
    callback = _child(spans, backend_server, "callback", "export-backend")
    assert callback.attributes["callback.seq"] == 1 and callback.attributes["callback.try"] == 1


def _echo_stack(services: Callable[..., Service], tmp_path: Path, collector: OtlpReceiver,
                **tracing: Any) -> Service:
    echo = services("tests.echo_upstream", {}, name="echo")
    config = gateway_config(tmp_path, echo.url, tracing={"exporter": "otlp", "endpoint": collector.url,
                                                         "sample_ratio": 0} | tracing)
    config["upstreams"]["echo"] = {"url": echo.url}
    config["routes"].append({"name": "echo", "path": "/echo/{rest}", "methods": ["GET"], "upstream": "echo",
                             "rewrite": "/got/{rest}", "plugins": []})
    return services("gateway", config)


def _sent_upstream(gateway: Service, traceparent: str) -> str:
    answer = httpx.get(f"{gateway.url}/echo/x", headers={"traceparent": traceparent}, timeout=10).json()
    return dict(answer["data"]["headers"])["traceparent"]


def test_a_client_cannot_force_tracing_unless_it_is_a_trusted_proxy(services: Callable[..., Service],
                                                                   tmp_path: Path) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    with OtlpReceiver() as collector:
        untrusting = _echo_stack(services, tmp_path / "a", collector, trusted_proxies=["10.0.0.0/8"])
        for _ in range(5):
            sent = _sent_upstream(untrusting, f"00-{trace_id}-b7ad6b7169203331-01")
            assert sent.split("-")[1] == trace_id, "the trace id is kept"
            assert sent.endswith("-00"), "a client's sampled flag does not force a recorded trace"
        trusting = _echo_stack(services, tmp_path / "b", collector, trusted_proxies=["127.0.0.0/8"])
        assert _sent_upstream(trusting, f"00-{trace_id}-b7ad6b7169203331-01").endswith("-01")
        always_on = _echo_stack(services, tmp_path / "c", collector, sampler="parentbased_always_on")
        assert _sent_upstream(always_on, f"00-{trace_id}-b7ad6b7169203331-01").endswith("-01")
        wait_until(lambda: len([s for s in collector.of_trace(trace_id) if s.name == "GET /echo/{rest}"]) == 2, 15,
                   what="the two trusted requests' spans")


def test_backend_metrics_from_start_up_and_after_work(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    text = scrape(backend)
    for name, labels in [("backend_task_retries_total", {"export_type": "flaky_export"}),
                         ("backend_lease_reclaims_total", {"export_type": "report_export"}),
                         ("backend_callback_deliveries_total", {"outcome": "failed"}),
                         ("backend_janitor_deletions_total", {}),
                         ("backend_task_ends_total", {"export_type": "flaky_export", "status": "COMPLETED"}),
                         ("backend_workers_busy", {}), ("backend_callback_claims_taken_over_total", {}),
                         ("backend_change_log_entries", {}), ("backend_change_log_oldest_age_seconds", {})]:
        assert metric(text, name, **labels) == 0, name
    assert metric(text, "backend_workers") == 2
    created = httpx.post(f"{backend.url}/exports", json={"export_type": "flaky_export"}, timeout=10,
                         headers=backend_headers("t1", **{"X-Task-Id": "exp-20261129-aaaaaaaaaaaaaaaaaaab"}))
    assert created.status_code == 201
    wait_status(backend.url, "exp-20261129-aaaaaaaaaaaaaaaaaaab", {"COMPLETED"})
    text = scrape(backend)
    assert metric(text, "backend_task_retries_total", export_type="flaky_export") == 1
    assert metric(text, "backend_task_ends_total", export_type="flaky_export", status="COMPLETED") == 1
    assert metric(text, "backend_task_rows_count", export_type="flaky_export") == 1
    assert metric(text, "backend_task_rows_sum", export_type="flaky_export") == 2000
    assert metric(text, "backend_task_duration_seconds_count", export_type="flaky_export", status="COMPLETED") == 1
    assert metric(text, "backend_tasks", tenant="t1", status="COMPLETED") == 1
    assert metric(text, "backend_queue_oldest_pending_age_seconds", tenant="t1") == 0
    # created, started, failed and re-queued, started again, completed: at least five changes
    assert (metric(text, "backend_change_log_entries") or 0) >= 5
    assert 0 < (metric(text, "backend_change_log_oldest_age_seconds") or 0) < 60


def test_queue_age_grows_while_tasks_wait(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path, workers=1))
    for i in range(2):  # the one worker runs the first; the second waits
        httpx.post(f"{backend.url}/exports", json={"export_type": "slow_export"}, timeout=10,
                   headers=backend_headers("slow", **{"X-Task-Id": f"exp-20261129-aaaaaaaaaaaaaaaaaab{i}"}))
    text = wait_until(lambda: t if metric(t := scrape(backend), "backend_workers_busy") == 1 else None, 15,
                      what="the worker to start the first task")
    assert metric(text, "backend_tasks", tenant="slow", status="PENDING") == 1
    assert metric(text, "backend_tasks", tenant="slow", status="RUNNING") == 1
    wait_until(lambda: (metric(scrape(backend), "backend_queue_oldest_pending_age_seconds", tenant="slow") or 0) >= 1,
               10, what="the waiting task's age to pass a second")


def test_gateway_stats_from_start_up_with_open_telemetry_names(services: Callable[..., Service],
                                                               tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    text = scrape(gateway)
    zero = [("gateway_retries_total", {"route": "status", "reason": "503"}),
            ("gateway_retries_total", {"route": "status", "reason": "timeout"}),
            ("gateway_retry_success_total", {"route": "status"}),
            ("gateway_retry_budget_exhausted_total", {"route": "submit", "upstream": "exports"}),
            ("gateway_upstream_calls_total", {"route": "status", "outcome": "timeout"}),
            ("gateway_status_cache_total", {"route": "status", "result": "coalesced"}),
            ("gateway_degraded_answers_total", {"route": "status", "kind": "stale"}),
            ("gateway_breaker_transitions_total", {"upstream": "exports", "state": "open"}),
            ("gateway_outbox_total", {"outcome": "delivered"}),
            ("gateway_config_reloads_total", {"outcome": "refused"}),
            ("gateway_outbox_depth", {})]
    for name, labels in zero:
        assert metric(text, name, **labels) == 0, (name, labels)
    config_hash = re.search(r'^gateway_config_info\{hash="([0-9a-f]{16})"\} 1\.0$', text, re.M)
    assert config_hash, "the config in force is named by its hash"
    assert httpx.get(f"{gateway.url}{API}?limit=1", headers=AUTH).status_code == 200
    text = scrape(gateway)
    assert metric(text, "http_server_request_duration_seconds_count", http_request_method="GET",
                  http_route=API, http_response_status_code="200") == 1
    assert metric(text, "gateway_requests_total", route="list", status="200") == 1
    assert metric(text, "gateway_request_duration_seconds_count", route="list") == 1
    assert metric(text, "gateway_upstream_calls_total", route="list", outcome="200") == 1
    assert "target_info" not in text, "no OpenTelemetry metrics exporter is left"

    gateway.config["routes"] = [r for r in gateway.config["routes"] if r["name"] != "list"]
    gateway.write_config()
    assert httpx.post(f"{gateway.url}/admin/reload?allow_removals=true", headers=ADMIN).status_code == 200
    text = scrape(gateway)
    assert metric(text, "gateway_config_reloads_total", outcome="applied") == 1
    new_hash = re.search(r'^gateway_config_info\{hash="([0-9a-f]{16})"\} 1\.0$', text, re.M)
    assert new_hash and new_hash.group(1) != config_hash.group(1)


def _json_lines(log: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_access_log_line_per_request_with_ids(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, access_log=True))
    trace_id = "1bf92f3577b34da6a3ce929d0e0e4731"
    created = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export"}, timeout=10,
                         headers=AUTH | {"X-Request-Id": "req-42", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    task_id = created.json()["data"]["task_id"]
    wait_status(gateway.url, task_id, {"COMPLETED"}, path=f"{API}/", headers=AUTH)
    httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH)

    def access() -> list[dict[str, Any]]:
        return [r for r in _json_lines(gateway.log()) if r.get("logger") == "gateway.access"]

    lines = wait_until(lambda: [r for r in access() if r["route"] == "status" and r.get("cache") == "HIT"], 10,
                       what="the cache hit's access line")
    submit = next(r for r in access() if r["request_id"] == "req-42")
    assert submit["trace_id"] == trace_id and submit["tenant"] == "demo" and submit["route"] == "submit"
    assert submit["status"] == 202 and submit["attempts"] == 1 and submit["duration_ms"] > 0
    assert submit["method"] == "POST" and submit["task_id"] == task_id
    assert lines[0]["tenant"] == "demo" and lines[0]["status"] == 200
    quiet = services("gateway", gateway_config(tmp_path / "quiet", backend.url), name="quiet")
    httpx.get(f"{quiet.url}{API}?limit=1", headers=AUTH)
    assert not [r for r in _json_lines(quiet.log()) if r.get("logger") == "gateway.access"], "opt-in only"


def _traceparent(trace_id: str) -> dict[str, str]:
    return {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}


def test_a_rerun_and_an_outbox_delivery_link_back_and_log_no_traceback(services: Callable[..., Service],
                                                                       tmp_path: Path) -> None:
    submit, poll, outboxed = "5bf92f3577b34da6a3ce929d0e0e4736", "6bf92f3577b34da6a3ce929d0e0e4736", \
        "7bf92f3577b34da6a3ce929d0e0e4736"
    fast_batches = {"OTEL_BSP_SCHEDULE_DELAY": "200"}  # the backend is killed below: its spans must be out by then
    with OtlpReceiver() as collector:
        backend = services("backend_stub", backend_config(tmp_path), OTEL_TRACES_EXPORTER="otlp",
                           OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, **fast_batches)
        config = gateway_config(tmp_path, backend.url, tracing={
            "exporter": "otlp", "endpoint": collector.url, "sample_ratio": 0, "trusted_proxies": ["127.0.0.0/8"]})
        config["upstreams"]["exports"]["circuit_breaker"] = {"fail_max": 50, "reset_timeout_sec": 1}
        for route in config["routes"]:
            route["plugins"] = [{"rerun": {"max_reruns": 1, "overrides": {"timeout_sec": 1}}}
                                if isinstance(p, dict) and "rerun" in p else p for p in route["plugins"]]
        gateway = services("gateway", config, **fast_batches)
        task_id = httpx.post(f"{gateway.url}{API}", json={"export_type": "slow_export", "timeout_sec": 1},
                             headers=AUTH | _traceparent(submit), timeout=10).json()["data"]["task_id"]
        # the poll that finds the TIMEOUT re-runs the task: the re-run stays in the task's trace, linked to the poll
        wait_until(lambda: httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH | _traceparent(poll))
                   .json()["data"]["reruns"] == 1, 15, what="the gateway's re-run of the TIMEOUT")
        wait_status(backend.url, task_id, {"TIMEOUT"}, headers={"X-Tenant-Id": "demo"}, timeout=30)
        # the first attempt's thread has stopped at a safe point by the time the re-run timed out too
        wait_until(lambda: "task ended" in backend.log() and backend.log().count('"status": "TIMEOUT"') >= 2, 10,
                   what="both attempts' end in the log")
        rerun = wait_until(lambda: next((s for s in collector.of_trace(submit) if s.name == "export slow_export"
                                         and s.attributes["export.attempt"] == 2), None), 15, what="the re-run's span")
        assert rerun.links == [poll] and rerun.attributes["export.status"] == "TIMEOUT"

        backend.kill()
        queued = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export"}, timeout=10,
                            headers=AUTH | _traceparent(outboxed))
        assert queued.status_code == 202 and queued.json()["data"]["degraded"] is True
        backend.start()
        wait_status(gateway.url, queued.json()["data"]["task_id"], {"COMPLETED"}, path=f"{API}/", headers=AUTH)

        def delivered() -> list[Span] | None:
            spans = collector.of_trace(outboxed)
            names = {(s.service, s.name) for s in spans}
            # the gateway's delivery span ends after the backend's answer: it may reach the collector last
            succeeded = any(s.name == "outbox delivery exports"
                            and s.attributes.get("http.response.status_code") == 201 for s in spans)
            return spans if succeeded and {("backend", "export report_export"),
                                           ("backend", "POST /exports")} <= names else None

        spans = wait_until(delivered, 15, what="the outbox delivery's spans")
    server = next(s for s in spans if s.service == "gateway" and s.name == f"POST {API}")
    refused = sorted((s for s in spans if s.parent_id == server.span_id and s.name == "upstream exports"),
                     key=lambda s: s.attributes["gateway.attempt"])  # the submit's tries while the backend was down
    assert [(s.attributes["gateway.attempt"], s.attributes.get("gateway.retry.reason")) for s in refused] == [
        (1, None), (2, "connect_error"), (3, "connect_error")]
    assert all(s.attributes["gateway.breaker.state"] == "closed" for s in refused)
    tries = [s for s in spans if s.name == "outbox delivery exports"]  # the ones before the backend was back failed
    assert tries and all(s.parent_id == server.span_id and s.links == [outboxed] for s in tries)
    assert {s.attributes["export.task_id"] for s in tries} == {queued.json()["data"]["task_id"]}
    delivery = next(s for s in tries if s.attributes.get("http.response.status_code") == 201)
    _child(spans, _child(spans, delivery, "POST /exports", "backend"), "export report_export", "backend")
    for service in (backend, gateway):
        assert "Traceback" not in service.log() and "never retrieved" not in service.log(), service.log()[-3000:]


def test_an_operator_rerun_links_back_to_the_admin_request(services: Callable[..., Service], tmp_path: Path) -> None:
    submit, operator = "8bf92f3577b34da6a3ce929d0e0e4736", "9bf92f3577b34da6a3ce929d0e0e4736"
    fast_batches = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
    with OtlpReceiver() as collector:
        backend = services("backend_stub", backend_config(tmp_path), OTEL_TRACES_EXPORTER="otlp",
                           OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, **fast_batches)
        gateway = services("gateway", gateway_config(tmp_path, backend.url, tracing={
            "exporter": "otlp", "endpoint": collector.url, "sample_ratio": 0, "trusted_proxies": ["127.0.0.0/8"]}),
            **fast_batches)
        task_id = httpx.post(f"{gateway.url}{API}", json={"export_type": "broken_export"}, timeout=10,
                             headers=AUTH | _traceparent(submit)).json()["data"]["task_id"]
        wait_status(backend.url, task_id, {"FAILED"}, tenant="demo")
        rerun = httpx.post(f"{gateway.url}/admin/recovery/tasks/{task_id}/rerun",
                           headers=ADMIN | _traceparent(operator))
        assert rerun.status_code == 200, rerun.text
        attempt = rerun.json()["data"]["attempt"]
        admin_spans = {"POST /admin/recovery/tasks/{task_id}/rerun", "POST /internal/tasks/{task_id}/rerun"}

        def both_traces() -> tuple[list[Span], list[Span]] | None:
            run = [s for s in collector.of_trace(submit) if s.name == "export broken_export"
                   and s.attributes["export.attempt"] == attempt]
            admin = collector.of_trace(operator)
            return (run, admin) if run and admin_spans <= {s.name for s in admin} else None

        run, admin = wait_until(both_traces, 20, what="the re-run's span and the admin request's")
    # the new attempt stays in the task's trace and links to the operator's request, as a TIMEOUT re-run does
    assert run[0].links == [operator]
    server = next(s for s in admin if s.service == "gateway" and s.name.startswith("POST /admin/"))
    assert server.parent_id == "00f067aa0ba902b7" and server.attributes["http.response.status_code"] == 200
    call = _child(admin, server, "upstream exports", "gateway")
    assert call.attributes["gateway.operator_action"] == "rerun"
    _child(admin, call, "POST /internal/tasks/{task_id}/rerun", "backend")
    audit = [r for r in _json_lines(gateway.log()) if r.get("logger") == "gateway.audit"]
    assert [(r["action"], r["trace_id"]) for r in audit] == [("rerun", operator)], "the audit line names the trace"


def test_operator_recovery_of_dead_letters_and_failed_tasks(services: Callable[..., Service], tmp_path: Path) -> None:
    with Receiver([500, 500]) as hook:
        backend = services("backend_stub", backend_config(tmp_path, callbacks=LOOPBACK | {"retry_delays_sec": [0.1]}))
        gateway = services("gateway", gateway_config(tmp_path, backend.url))
        task_id = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export", "callback_url": hook.url},
                             headers=AUTH, timeout=10).json()["data"]["task_id"]
        broken = httpx.post(f"{gateway.url}{API}", json={"export_type": "broken_export"}, headers=AUTH,
                            timeout=10).json()["data"]["task_id"]
        wait_until(lambda: httpx.get(f"{backend.url}/exports/{task_id}", headers=backend_headers("demo")).json()
                   ["data"]["callback"]["state"] == "FAILED", 15, what="the callback to be given up on")
        dead = f"{gateway.url}/admin/recovery/callbacks"
        assert httpx.get(dead, params={"tenant": "demo"}).status_code == 401
        refused = httpx.get(dead, params={"tenant": "demo", "limit": "0"}, headers=ADMIN)
        assert refused.status_code == 422 and refused.json()["code"] != 0
        listed = httpx.get(dead, params={"tenant": "demo"}, headers=ADMIN).json()["data"]
        assert [t["task_id"] for t in listed["items"]] == [task_id]
        assert listed["items"][0]["callback"]["state"] == "FAILED" and listed["items"][0]["callback_seq"] == 1
        assert httpx.get(dead, params={"tenant": "other"}, headers=ADMIN).json()["data"]["items"] == []

        again = httpx.post(f"{gateway.url}/admin/recovery/tasks/{task_id}/redeliver", headers=ADMIN)
        assert again.status_code == 200 and again.json()["data"]["callback_seq"] == 2
        wait_until(lambda: hook.count() == 3, 15, what="the re-delivered notification")
        assert json.loads(hook.received[2].body)["callback_seq"] == 2
        assert hook.received[2].headers["webhook-id"] == f"msg_{task_id}_2"
        batch = httpx.post(f"{gateway.url}/admin/recovery/callbacks/redeliver", headers=ADMIN,
                           json={"task_ids": [task_id, "exp-20261129-zzzzzzzzzzzzzzzzzzzz"]}).json()["data"]
        assert batch["results"][task_id] == {"ok": True, "callback_seq": 3}
        assert batch["results"]["exp-20261129-zzzzzzzzzzzzzzzzzzzz"]["code"] == 40401
        wait_until(lambda: hook.count() == 4, 15, what="the batch's notification")

        wait_status(backend.url, broken, {"FAILED"}, tenant="demo")
        failed = httpx.get(f"{gateway.url}/admin/recovery/tasks", params={"tenant": "demo", "status": "FAILED"},
                           headers=ADMIN).json()["data"]["items"]
        assert [t["task_id"] for t in failed] == [broken] and failed[0]["error"]["retryable"] is False
        rerun = httpx.post(f"{gateway.url}/admin/recovery/tasks/{broken}/rerun", headers=ADMIN)
        assert rerun.status_code == 200 and rerun.json()["data"]["status"] == "PENDING"
        assert rerun.json()["data"]["attempt"] == failed[0]["attempt"] + 1
        completed = httpx.post(f"{gateway.url}/admin/recovery/tasks/{task_id}/rerun", headers=ADMIN)
        assert completed.status_code == 409 and completed.json()["code"] == 40905
    audit = [r for r in _json_lines(gateway.log()) if r.get("logger") == "gateway.audit"]
    assert {(r["action"], r["outcome"]) for r in audit} >= {
        ("list_dead_letters", "done"), ("redeliver", "done"), ("redeliver_batch", "done"), ("rerun", "done"),
        ("rerun", "refused_409"), ("list_dead_letters", "refused_422")}
    assert {r["client"] for r in audit} == {"127.0.0.1"}, "each audit line names who acted"
    gateway_text, backend_text = scrape(gateway), scrape(backend)
    assert metric(gateway_text, "gateway_operator_actions_total", action="rerun", outcome="done") == 1
    assert metric(backend_text, "backend_operator_actions_total", action="redeliver", outcome="done") == 2
    assert metric(backend_text, "backend_operator_actions_total", action="redeliver", outcome="not_found") == 1
    assert metric(backend_text, "backend_callback_deliveries_total", outcome="failed") == 1


def test_a_client_that_goes_away_mid_body_is_an_info_line(services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, backend.url))
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(f"POST {API} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEMO_KEY}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"export_type\":".encode())
    line = wait_until(lambda: next((r for r in _json_lines(gateway.log()) if "went away" in r["msg"]), None), 10,
                      what="the disconnect's log line")
    assert line["level"] == "info" and line["route"] == "submit"
    assert "Traceback" not in gateway.log()
    assert metric(scrape(gateway), "gateway_requests_total", route="submit", status="499") == 1
