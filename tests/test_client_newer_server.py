"""The SDK and exportctl against a newer gateway: fields, statuses and formats they do not know come through as values.

The newer gateway is a real HTTP server on a free port that answers the public API
as a later version could: extra fields at every level, a `parquet` format, a
`QUEUED` status while the task waits (with `Retry-After`, as for any status in
progress) and an `ARCHIVED` one at the end (without it).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from exports_client import AsyncExportsClient, ExportsClient, Task, polling
from exports_client.models import STATUSES
from tests.procs import ROOT
from tests.test_cli import EXPORTCTL

KEY = "newer-key"
FILE = b"PAR1" + bytes(range(256)) * 4 + b"PAR1"  # what a parquet file looks like to a client: bytes
PARQUET_ID = "exp-20270101-parquet0000000001"
ARCHIVED_ID = "exp-20270101-archived000000001"
EXPORT_TYPE = {
    "export_type": "order_export", "filters_schema": {"type": "object", "properties": {"region": {"type": "string"}}},
    "formats": ["parquet", "csv"], "compression": None, "max_attempts": 3, "estimated_completion_sec": 60,
    "sla_tier": "gold",  # unknown to this SDK
}


def completed(task_id: str, base_url: str) -> dict[str, Any]:
    return {
        "task_id": task_id, "export_type": "order_export", "status": "COMPLETED", "progress": 100,
        "current_step": None, "attempt": 1, "created_at": "2027-01-01T00:00:00Z", "updated_at": "2027-01-01T00:00:09Z",
        "result": {"download_url": f"{base_url}/api/v1/exports/{task_id}/download?expires=1&sig=x",
                   "expire_at": "2027-01-02T00:00:09Z", "rows": 42, "bytes": len(FILE), "format": "parquet",
                   "compression": None, "sha256": "d" * 64, "row_groups": 1},
        "error": None, "degraded": False,
        "callback": {"state": "DELIVERED", "attempts": 1, "last_error": None, "delivered_at": "2027-01-01T00:00:10Z"},
        "format": "parquet", "region_served": "eu-west", "cost": {"credits": 3},
    }


def archived(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "export_type": "order_export", "status": "ARCHIVED", "progress": 100,
            "archived_at": "2027-01-01T01:00:00Z"}


class NewerGateway:
    """Answers as a later gateway version; `polls` counts the status reads of each task, `seen` keeps requests."""

    def __init__(self) -> None:
        self.polls: dict[str, int] = {}
        self.seen: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gateway.answer(self, "GET", None)

            def do_POST(self) -> None:
                gateway.answer(self, "POST", json.loads(self.rfile.read(int(self.headers["content-length"]))))

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        url = urlsplit(handler.path)
        with self.lock:
            self.seen.append((method, handler.path, body))
        if handler.headers.get("authorization") != f"Bearer {KEY}":
            return self.send(handler, 401, {"code": 40100, "message": "bad key", "data": None})
        parts = url.path.strip("/").split("/")  # api, v1, exports[, id[, download]]
        if url.path == "/api/v1/export-types":
            return self.send(handler, 200, {"code": 0, "message": "success", "data": {"items": [EXPORT_TYPE]}})
        if url.path == "/api/v1/exports" and method == "POST":
            task_id = ARCHIVED_ID if body["export_type"] == "archived_export" else PARQUET_ID
            data = {"task_id": task_id, "status": "QUEUED", "estimated_completion_sec": 60, "priority": "high"}
            return self.send(handler, 202, {"code": 0, "message": "success", "data": data}, retry_after=1)
        if url.path == "/api/v1/exports":
            items = [archived(ARCHIVED_ID)] if parse_qs(url.query).get("status") == ["ARCHIVED"] else []
            return self.send(handler, 200, {"code": 0, "message": "success",
                                            "data": {"items": items, "next_cursor": None}})
        if len(parts) == 5 and parts[4] == "events":  # this gateway serves no event streams: the SDK polls
            return self.send(handler, 404, {"code": 40400, "message": "no such route", "data": None})
        if len(parts) == 5 and parts[4] == "download":
            handler.send_response(200)
            handler.send_header("Content-Type", "application/vnd.apache.parquet")
            handler.send_header("Content-Length", str(len(FILE)))
            handler.end_headers()
            handler.wfile.write(FILE)
            return None
        task_id = parts[3]
        with self.lock:
            self.polls[task_id] = self.polls.get(task_id, 0) + 1
            first = self.polls[task_id] == 1
        if task_id == ARCHIVED_ID:
            return self.send(handler, 200, {"code": 0, "message": "success", "data": archived(task_id)})
        if first:  # still waiting its turn, in a status this SDK does not know: the gateway asks for another poll
            return self.send(handler, 200, {"code": 0, "message": "success",
                                            "data": {"task_id": task_id, "status": "QUEUED", "progress": 0,
                                                     "queue_position": 2}}, retry_after=1)
        return self.send(handler, 200, {"code": 0, "message": "success", "data": completed(task_id, self.url)})

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any],
             retry_after: int | None = None) -> None:
        raw = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        if retry_after is not None:
            handler.send_header("Retry-After", str(retry_after))
        handler.end_headers()
        handler.wfile.write(raw)


@pytest.fixture
def newer() -> Iterator[NewerGateway]:
    gateway = NewerGateway()
    yield gateway
    gateway.close()


def test_the_sdk_keeps_what_a_newer_gateway_adds_and_follows_its_statuses(newer: NewerGateway,
                                                                          tmp_path: Path) -> None:
    with ExportsClient(newer.url, KEY) as c:
        (kind,) = c.export_types()
        assert kind.formats == ["parquet", "csv"] and kind.extra == {"sla_tier": "gold"}
        assert kind.to_dict() == EXPORT_TYPE

        task = c.submit("order_export", {"region": "eu-west"}, format="parquet")
        assert (task.status, task.extra) == ("QUEUED", {"priority": "high"})
        assert newer.seen[-1][2]["format"] == "parquet"
        assert not task.terminal and not task.running

        progress: list[Task] = []
        done = c.wait(task.task_id, max_wait=30, on_progress=progress.append)
        # QUEUED came with Retry-After, so the wait went on to the second poll rather than stopping there
        assert newer.polls[PARQUET_ID] == 2 and [t.status for t in progress] == ["QUEUED"]
        assert progress[0].extra == {"queue_position": 2}
        assert done.status == "COMPLETED" and done.result is not None and done.callback is not None
        assert (done.result.format, done.result.extra) == ("parquet", {"sha256": "d" * 64, "row_groups": 1})
        assert done.callback.extra == {"delivered_at": "2027-01-01T00:00:10Z"}
        assert done.extra == {"region_served": "eu-west", "cost": {"credits": 3}}
        assert completed(PARQUET_ID, newer.url).items() <= done.to_dict().items()  # nothing the gateway said is lost

        path = c.download(done, tmp_path / "orders.parquet")
        assert path is not None and path.read_bytes() == FILE

        started = time.monotonic()
        ended = c.wait(ARCHIVED_ID, max_wait=30)
        # ARCHIVED came without Retry-After: over at the first answer, not at max_wait
        assert ended.status == "ARCHIVED" and newer.polls[ARCHIVED_ID] == 1
        assert time.monotonic() - started < 5 and ended.extra == {"archived_at": "2027-01-01T01:00:00Z"}
        assert [t.status for t in c.list(status="ARCHIVED")] == ["ARCHIVED"]


def test_the_async_client_ends_its_wait_on_a_final_status_it_does_not_know(newer: NewerGateway) -> None:
    async def run() -> Task:
        async with AsyncExportsClient(newer.url, KEY) as c:
            return await c.wait(ARCHIVED_ID, max_wait=30)

    assert asyncio.run(run()).status == "ARCHIVED" and newer.polls[ARCHIVED_ID] == 1


def test_a_wait_ends_on_a_known_final_status_or_an_unknown_one_the_gateway_does_not_ask_to_poll_again() -> None:
    for status in STATUSES:
        task = Task("t", status)
        # a known status decides alone, whatever the header says
        assert polling.finished(task, None) == polling.finished(task, 5.0) == task.terminal
    assert not polling.finished(Task("t", "QUEUED"), 1.0)
    assert polling.finished(Task("t", "ARCHIVED"), None)


def exportctl(newer: NewerGateway, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXPORTS_URL": newer.url, "EXPORTS_API_KEY": KEY}
    return subprocess.run([EXPORTCTL, *args], check=False, env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_exportctl_shows_a_newer_gateways_formats_statuses_and_fields(newer: NewerGateway, tmp_path: Path) -> None:
    dest = tmp_path / "orders.parquet"
    out = exportctl(newer, "submit", "order_export", "--format", "parquet", "--download", str(dest), "--json")
    assert out.returncode == 0, out.stderr
    assert completed(PARQUET_ID, newer.url).items() <= json.loads(out.stdout).items()
    assert dest.read_bytes() == FILE
    assert f"{PARQUET_ID} QUEUED 0%" in out.stderr  # the progress line shows the unknown status as it is

    waited = exportctl(newer, "wait", ARCHIVED_ID)
    assert waited.returncode == 1 and waited.stdout.startswith(f"{ARCHIVED_ID} ARCHIVED 100%"), waited.stderr
    refused = exportctl(newer, "download", ARCHIVED_ID, str(tmp_path / "never"))
    assert refused.returncode == 1 and "is ARCHIVED: only a COMPLETED task has a file" in refused.stderr
    assert "wait for it first" not in refused.stderr and not (tmp_path / "never").exists()

    listed = exportctl(newer, "list", "--status", "ARCHIVED", "--json")
    assert listed.returncode == 0 and archived(ARCHIVED_ID).items() <= json.loads(listed.stdout)[0].items()
    assert parse_qs(urlsplit(newer.seen[-1][1]).query)["status"] == ["ARCHIVED"]
    types = exportctl(newer, "types")
    assert types.stdout.strip() == "order_export: filters region; formats parquet, csv"
    assert json.loads(exportctl(newer, "types", "--json").stdout) == [EXPORT_TYPE]
    for result in (out, waited, refused, listed, types):
        assert "Traceback" not in result.stderr
