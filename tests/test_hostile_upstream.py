"""The edge against a hostile upstream and a stuck plugin (issue 29), with real processes.

The upstream is tests/hostile_upstream.py, on raw sockets: an endless JSON answer, a drip, a
transfer coding nobody decodes, a call that never answers, and an echo of the request target as
it arrived (to see what a rewrite sent).
"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, gateway_config
from tests.procs import ROOT, Service, free_port, wait_until

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
MAX_ANSWER = 1024 * 1024
ROUTES: list[dict[str, Any]] = [
    {"name": "h-one", "path": "/h/one/{p}", "methods": ["GET"], "upstream": "hostile", "rewrite": "/echo/{p}/tail",
     "plugins": ["auth"]},
    {"name": "h-path", "path": "/h/path/{p:path}", "methods": ["GET"], "upstream": "hostile",
     "rewrite": "/echo/{p}", "plugins": ["auth"]},
    {"name": "h-raw", "path": "/h/raw/{p:path}", "methods": ["GET"], "upstream": "hostile", "rewrite": "/{p}",
     "plugins": ["auth"]},
    # signed_download reads a JSON answer whole to sign its links
    {"name": "h-signed", "path": "/h/signed/{p:path}", "methods": ["GET"], "upstream": "hostile",
     "rewrite": "/{p}", "max_answer_bytes": MAX_ANSWER, "plugins": ["auth", {"signed_download": {"action": "sign"}}],
     "policy": {"timeout": {"connect": 2, "read": 5, "total": 2}}},
    # stale_if_error keeps each 200 it reads whole, per task id, and answers it when the upstream fails
    {"name": "h-stale", "path": "/h/stale/{mode}/{task_id}", "methods": ["GET"], "upstream": "hostile",
     "rewrite": "/{mode}/{task_id}", "max_answer_bytes": MAX_ANSWER,
     "plugins": ["auth", {"stale_if_error": {"param": "task_id"}}]},
    # a plugin that never returns (fault's delay stands in for a third-party plugin stuck on a lock)
    {"name": "h-stuck", "path": "/h/stuck", "methods": ["GET"], "upstream": "hostile", "rewrite": "/echo/stuck",
     "first_byte_timeout_sec": 1.5, "plugins": ["auth", {"fault": {"delay": {"seconds": 600}}}]},
]


def _config(workdir: Path, hostile: Service, **override: Any) -> dict[str, Any]:
    config = gateway_config(workdir, hostile.url, **override)
    config["upstreams"]["exports"]["change_feed"] = None
    config["upstreams"]["exports"]["timeouts"] = {"connect": 1, "read": 1}  # an operator call's total: 4 s
    config["upstreams"]["hostile"] = {"url": hostile.url, "change_feed": None}
    config["routes"] = config["routes"] + ROUTES
    return config


class Edge:
    def __init__(self, hostile: Service, gateway: Service) -> None:
        self.hostile, self.gateway = hostile, gateway

    def stats(self) -> dict[str, int]:
        return dict(httpx.get(f"{self.hostile.url}/stats", timeout=5).json()["data"])


@pytest.fixture(scope="module")
def edge(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Edge:
    workdir = tmp_path_factory.mktemp("hostile")
    hostile = module_services("tests.hostile_upstream", {}, name="hostile")
    gateway = module_services("gateway", _config(workdir, hostile), name="gateway")
    return Edge(hostile, gateway)


def raw_get(url: str, target: str, headers: dict[str, str] = AUTH) -> tuple[int, bytes]:
    """GET `target` exactly as written (no client normalises its dots or escapes): (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def upstream_target(edge: Edge, target: str) -> str:
    status, body = raw_get(edge.gateway.url, target)
    assert status == 200, body
    data = yaml.safe_load(body)["data"]  # JSON is YAML
    assert data["host"] == edge.hostile.url.removeprefix("http://")
    return str(data["target"])


def test_an_endless_answer_read_whole_is_a_quick_502_with_bounded_memory(edge: Edge) -> None:
    before = edge.gateway.rss_bytes()
    started_before = edge.stats()["endless_started"]
    for _ in range(3):
        began = time.monotonic()
        resp = httpx.get(f"{edge.gateway.url}/h/signed/endless", headers=AUTH, timeout=20)
        assert time.monotonic() - began < 5
        assert resp.status_code == 502, resp.text
        error = resp.json()
        assert error["data"] == {"reason": "answer_too_large", "max_answer_bytes": MAX_ANSWER}
        assert "max_answer_bytes" in error["message"]
    # the gateway closed each upstream connection: the upstream stopped writing
    wait_until(lambda: edge.stats()["endless_open"] == 0, 5, what="the endless answers' connections to close")
    assert edge.stats()["endless_started"] == started_before + 3
    assert edge.gateway.rss_bytes() - before < 40 * 2**20


def test_an_answer_past_the_bound_is_not_kept(edge: Edge) -> None:
    def get(mode: str, task: str) -> httpx.Response:
        return httpx.get(f"{edge.gateway.url}/h/stale/{mode}/{task}", headers=AUTH, timeout=20)

    # the control: a whole answer is kept, and answered stale when the upstream then fails
    assert get("echo", "kept").status_code == 200
    stale = get("coded", "kept")
    assert stale.status_code == 200 and stale.headers["x-degraded"] == "stale"
    # past the bound: 502, and nothing of it kept to answer later
    assert get("endless", "cut").json()["data"]["reason"] == "answer_too_large"
    assert get("coded", "cut").status_code == 503


def test_the_total_deadline_covers_an_answer_read_whole(edge: Edge) -> None:
    began = time.monotonic()
    resp = httpx.get(f"{edge.gateway.url}/h/signed/drip", headers=AUTH, timeout=20)
    elapsed = time.monotonic() - began
    assert resp.status_code == 504, resp.text
    assert 1.5 < elapsed < 6, elapsed  # total: 2 s, though every read is quick (slack: a loaded machine)


def test_an_operator_call_to_a_trickling_backend_ends_at_its_total(edge: Edge) -> None:
    began = time.monotonic()
    resp = httpx.get(f"{edge.gateway.url}/admin/recovery/tasks", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                     timeout=30)
    elapsed = time.monotonic() - began
    assert resp.status_code == 504 and resp.json()["code"] == 50400, resp.text
    assert 3.5 < elapsed < 10, elapsed  # connect + 3 x read = 4 s, though every read is quick


def test_an_unknown_transfer_coding_is_a_502_not_raw_bytes(edge: Edge) -> None:
    for route in ("raw", "signed"):
        resp = httpx.get(f"{edge.gateway.url}/h/{route}/coded", headers=AUTH, timeout=20)
        assert resp.status_code == 502, resp.text
        assert resp.json()["code"] == 50200


def test_path_params_are_encoded_as_segments(edge: Edge) -> None:
    assert upstream_target(edge, "/h/one/a%3Fq=1") == "/echo/a%3Fq=1/tail"
    assert upstream_target(edge, "/h/one/a%23b") == "/echo/a%23b/tail"
    assert upstream_target(edge, "/h/one/a%25b") == "/echo/a%25b/tail"
    assert upstream_target(edge, "/h/one/@127.0.0.1:1") == "/echo/@127.0.0.1:1/tail"
    assert upstream_target(edge, "/h/raw/@127.0.0.1:1") == "/@127.0.0.1:1"
    assert upstream_target(edge, "/h/path/a/b%3F/c%23") == "/echo/a/b%3F/c%23"
    for target in ("/h/one/%2e%2e", "/h/one/%2E", "/h/path/a/%2e%2e/b", "/h/path/%2e%2e", "/h/raw/x/%2e%2e/y"):
        status, body = raw_get(edge.gateway.url, target)
        assert status == 404, (target, body)
        assert b"segment" in body


def test_a_rewrite_that_is_not_a_path_is_refused_at_load(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "http://127.0.0.1:9")
    config["routes"].append({"name": "bad", "path": "/bad/{p}", "methods": ["GET"], "upstream": "exports",
                             "rewrite": "{p}/x"})
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "rewrite must start with /" in done.stderr and "Traceback" not in done.stderr


def test_a_plugin_that_never_returns_gets_504_at_the_route_deadline(edge: Edge) -> None:
    began = time.monotonic()
    resp = httpx.get(f"{edge.gateway.url}/h/stuck", headers=AUTH, timeout=20)
    elapsed = time.monotonic() - began
    assert resp.status_code == 504, resp.text
    assert resp.json()["data"] == {"reason": "deadline"}
    assert 1.4 < elapsed < 6, elapsed


def test_sigterm_with_a_hung_request_exits_within_the_shutdown_limit(
        edge: Edge, services: Callable[..., Service], tmp_path: Path) -> None:
    config = _config(tmp_path, edge.hostile, shutdown_timeout_sec=1)
    config["routes"].append({"name": "h-hung", "path": "/h/hung", "methods": ["GET"], "upstream": "hostile",
                             "rewrite": "/hang", "plugins": ["auth"],
                             "policy": {"timeout": {"connect": 2, "read": 600, "total": 600}}})
    gateway = services("gateway", config, name="stopping")
    hanging = edge.stats()["hanging"]
    outcome: list[object] = []
    caller = threading.Thread(target=lambda: outcome.append(_get_or_error(f"{gateway.url}/h/hung")))
    caller.start()
    wait_until(lambda: edge.stats()["hanging"] > hanging, 10, what="the request to reach the upstream")
    began = time.monotonic()
    gateway.signal(15)
    assert gateway.proc is not None
    gateway.proc.wait(10)
    assert time.monotonic() - began < 6  # 1 s of grace, then the hung request is cancelled
    caller.join(10)
    assert outcome and outcome[0] != 200
    wait_until(lambda: edge.stats()["hanging"] == hanging, 5, what="the upstream call to be closed")


def _get_or_error(url: str) -> object:
    try:
        return httpx.get(url, headers=AUTH, timeout=30).status_code
    except httpx.HTTPError as exc:
        return exc


def test_outboxed_submits_survive_transient_refusals_and_a_final_refusal_reads_failed(
        services: Callable[..., Service], tmp_path: Path) -> None:
    port = free_port()  # the backend is down when the submits come: both go to the outbox
    config = gateway_config(tmp_path, f"http://127.0.0.1:{port}")
    config["upstreams"]["exports"]["change_feed"] = None
    config["upstreams"]["exports"]["timeouts"] = {"connect": 1, "read": 1}  # an operator call's total: 4 s
    config["upstreams"]["exports"]["circuit_breaker"] = {"fail_max": 5, "reset_timeout_sec": 1}
    gateway = services("gateway", config, name="outboxing")
    ids = {}
    for kind in ("quota", "refused"):
        resp = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": kind}, timeout=30,
                          headers=AUTH | {"Idempotency-Key": f"key-{kind}"})
        assert resp.status_code == 202 and resp.json()["data"]["degraded"], resp.text
        ids[kind] = resp.json()["data"]["task_id"]
    backend = services("tests.hostile_upstream", {"port": port}, name="late-backend")

    def status(kind: str) -> dict[str, Any]:
        resp = httpx.get(f"{gateway.url}/api/v1/exports/{ids[kind]}", headers=AUTH, timeout=10)
        assert resp.status_code == 200, resp.text  # never 404: the task is the outbox's or the backend's
        return dict(resp.json()["data"])

    # 429 twice (the active-task quota), then created: kept and tried again, not dropped
    wait_until(lambda: not status("quota")["degraded"], 20, what="the quota-refused submit to be delivered")
    stats = httpx.get(f"{backend.url}/stats", timeout=5).json()["data"]
    assert stats["submits"][ids["quota"]] == 3
    # the quota-refused submit waited alone: the one behind it was tried before its retries
    answers = [tuple(a) for a in stats["answers"]]
    assert answers.index((ids["refused"], 422)) < answers.index((ids["quota"], 201))
    failed = wait_until(lambda: (s := status("refused"))["status"] == "FAILED" and s, 20,
                        what="the refused submit to read FAILED")
    assert failed["error"]["code"] == "SUBMIT_REFUSED_42200" and "not offered" in failed["error"]["message"]
    assert status("refused") == failed
    replay = httpx.post(f"{gateway.url}/api/v1/exports", json={"export_type": "refused"}, timeout=30,
                        headers=AUTH | {"Idempotency-Key": "key-refused"})
    assert replay.status_code == 202 and replay.json()["data"]["task_id"] == ids["refused"]


def test_a_callback_to_an_ipv4_translated_private_address_is_refused(edge: Edge) -> None:
    for host in ("[::ffff:0:10.0.0.1]", "[::ffff:0:a9fe:a9fe]", "[::ffff:0:127.0.0.1]"):
        resp = httpx.post(f"{edge.gateway.url}/api/v1/exports", headers=AUTH, timeout=10,
                          json={"export_type": "report_export", "callback_url": f"http://{host}/hook"})
        if host == "[::ffff:0:127.0.0.1]":  # the test config allows 127.0.0.0/8: judged as the IPv4 it reaches
            assert resp.status_code != 422, resp.text
            continue
        assert resp.status_code == 422, resp.text
        assert resp.json()["data"]["field"] == "callback_url"
