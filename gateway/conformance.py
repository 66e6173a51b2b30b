"""`python -m gateway conformance --upstream URL`: whether a backend speaks the task contract the gateway relies on.

For a team that brings its own task service: each check prints one line (PASS, FAIL with what was
wrong, or OPTIONAL for what the gateway can do without), and the command exits 0 only when every
required check passed. The contract itself is docs/backend-teams/upstream-openapi.yaml.

It creates only tasks named `conformance-YYYYMMDD-...`, for its own tenant, cancels them at the
end and names any it could not cancel.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from exports_common.contract import STATUSES, TERMINAL
from exports_common.task_ids import new_task_id

TASK_PREFIX = "conformance"
WAIT_SEC = 60.0  # for the first task to finish, so that its file can be read
POLL_SEC = 0.25
FEED_LINE_BYTES = 1024 * 1024  # the change feed's first line, at most
FEED_WAIT_SEC = 10.0  # for that line
ANSWER_BYTES = 16 * 1024 * 1024  # any one answer, at most
ANSWER_SEC = 30.0  # to read any one answer (each read also has the client's own timeout)


class Failed(Exception):
    """A check found the backend off the contract; the message says how."""


@dataclass
class Run:
    """One conformance run against one upstream: its client, the tasks it made, what each check found."""

    client: httpx.Client
    tenant: str
    other_tenant: str
    export_type: str = ""
    created: list[str] = field(default_factory=list)
    finished: dict[str, Any] | None = None  # a COMPLETED task of ours, once one is
    failures: int = 0

    def headers(self, tenant: str | None = "") -> dict[str, str]:
        """X-Tenant-Id of this run's tenant (by default), another one, or none (None)."""
        return {} if tenant is None else {"X-Tenant-Id": tenant or self.tenant}

    def create(self, task_id: str | None = None, body: dict[str, Any] | None = None) -> httpx.Response:
        task_id = task_id or new_task_id(TASK_PREFIX)
        resp = self.client.post("/exports", json=body or {"export_type": self.export_type},
                                headers={**self.headers(), "X-Task-Id": task_id})
        if resp.is_success and task_id not in self.created:
            self.created.append(task_id)
        return resp

    def report(self, name: str, check: Callable[[Run], str | None], optional: bool = False) -> None:
        try:
            note = check(self)
        except Failed as exc:
            self._failed(name, str(exc), optional)
        except httpx.HTTPError as exc:
            self._failed(name, f"the request failed: {type(exc).__name__}: {exc}", optional)
        except (LookupError, TypeError, AttributeError) as exc:  # the right status, a body of the wrong shape
            self._failed(name, f"an answer does not have the contract's shape: {type(exc).__name__}: {exc}"[:300],
                         optional)
        else:
            print(f"PASS     {name}" + (f" ({note})" if note else ""))

    def _failed(self, name: str, why: str, optional: bool) -> None:
        if optional:
            print(f"OPTIONAL {name}: {why}")
        else:
            self.failures += 1
            print(f"FAIL     {name}: {why}")


def data_of(resp: httpx.Response, *statuses: int) -> Any:
    """The envelope's `data`, once the status is one of `statuses` and the body is the contract's envelope."""
    if resp.status_code not in statuses:
        raise Failed(f"{resp.request.method} {resp.request.url.path} answered {resp.status_code}, expected "
                     f"{' or '.join(map(str, statuses))}: {resp.text[:200]}")
    try:
        body = resp.json()
    except ValueError:
        raise Failed(f"{resp.request.url.path} answered a body that is not JSON: {resp.text[:200]}") from None
    if not isinstance(body, dict) or not {"code", "message", "data"} <= body.keys():
        raise Failed(f"{resp.request.url.path} answered without the envelope {{code, message, data}}: {body!r:.200}")
    return body["data"]


def expect(ok: bool, why: str) -> None:
    if not ok:
        raise Failed(why)


def first_task(run: Run) -> str:
    expect(bool(run.created), "no task to check: the create check failed")
    return run.created[0]


# ----------------------------------------------------------------------------------------- the checks, in order

def export_types(run: Run) -> str:
    resp = run.client.get("/export-types")
    items = data_of(resp, 200).get("items")
    expect(isinstance(items, list) and bool(items), "GET /export-types lists no export type (data.items)")
    expect(all(isinstance(i, dict) and i.get("export_type") and i.get("formats") for i in items),
           "every export type needs export_type and formats")
    etag = resp.headers.get("etag")
    expect(bool(etag), "GET /export-types answered without an ETag (the gateway re-reads it with If-None-Match)")
    again = run.client.get("/export-types", headers={"If-None-Match": str(etag)})
    expect(again.status_code == 304, f"If-None-Match with its own ETag answered {again.status_code}, expected 304")
    names = [str(i["export_type"]) for i in items]
    run.export_type = run.export_type or names[0]
    expect(run.export_type in names, f"export type {run.export_type!r} is not listed (listed: {names})")
    return f"{len(items)} types; tasks use {run.export_type}"


def create(run: Run) -> None:
    task_id = new_task_id(TASK_PREFIX)
    data = data_of(run.create(task_id), 200, 201, 202)
    expect(data.get("task_id") == task_id, f"the create answered task_id {data.get('task_id')!r}, not the "
                                           f"X-Task-Id the gateway sent ({task_id})")


def idempotent_create(run: Run) -> None:
    task_id = first_task(run)
    data = data_of(run.create(task_id), 200, 201, 202)
    expect(data.get("task_id") == task_id, "a repeated create answered another task")
    other = run.create(task_id, {"export_type": run.export_type, "timeout_sec": 7})
    expect(other.status_code == 409, f"a create with the same task id and another body answered "
                                     f"{other.status_code}, expected 409")


def status_fields(run: Run) -> None:
    data = data_of(run.client.get(f"/exports/{first_task(run)}", headers=run.headers()), 200)
    missing = {"task_id", "status", "progress", "export_type", "created_at"} - data.keys()
    expect(not missing, f"the task lacks {sorted(missing)}")
    expect(data["status"] in STATUSES, f"status {data['status']!r} is none of {list(STATUSES)}")
    progress = data["progress"]
    expect(isinstance(progress, int) and 0 <= progress <= 100, f"progress {progress!r} is not an integer 0-100")


def progress(run: Run) -> str:
    task_id, seen = first_task(run), [0]
    deadline = time.monotonic() + WAIT_SEC
    while time.monotonic() < deadline:
        data = data_of(run.client.get(f"/exports/{task_id}", headers=run.headers()), 200)
        expect(data["progress"] >= seen[-1], f"progress went back from {seen[-1]} to {data['progress']}")
        seen.append(data["progress"])
        if data["status"] in TERMINAL:
            expect(data["status"] == "COMPLETED", f"the task ended {data['status']}: {data.get('error')}")
            expect(data["progress"] == 100, f"a COMPLETED task's progress is {data['progress']}, not 100")
            run.finished = data
            return f"COMPLETED after {len(seen) - 1} polls"
        time.sleep(POLL_SEC)
    raise Failed(f"the task did not finish within {WAIT_SEC:.0f} s (last progress {seen[-1]})")


def unknown_id(run: Run) -> None:
    resp = run.client.get(f"/exports/{new_task_id(TASK_PREFIX)}", headers=run.headers())
    data_of(resp, 404)


def tenant_required(run: Run) -> None:
    task_id = first_task(run)
    for method, path in (("GET", f"/exports/{task_id}"), ("GET", "/exports"), ("POST", f"/exports/{task_id}/cancel"),
                         ("POST", "/exports")):
        headers = {"X-Task-Id": new_task_id(TASK_PREFIX)} if path == "/exports" and method == "POST" else {}
        body = {"export_type": run.export_type} if method == "POST" else None
        resp = run.client.request(method, path, headers=headers, json=body)
        expect(resp.status_code == 400, f"{method} {path} without X-Tenant-Id answered {resp.status_code}, "
                                        f"expected 400")


def tenant_isolation(run: Run) -> None:
    task_id = first_task(run)
    resp = run.client.get(f"/exports/{task_id}", headers=run.headers(run.other_tenant))
    expect(resp.status_code == 404, f"tenant {run.other_tenant} read tenant {run.tenant}'s task: "
                                    f"answered {resp.status_code}, expected 404")
    listed = data_of(run.client.get("/exports", headers=run.headers(run.other_tenant)), 200)
    expect(task_id not in {i.get("task_id") for i in listed.get("items", [])},
           f"tenant {run.other_tenant}'s list shows tenant {run.tenant}'s task")


def list_with_cursor(run: Run) -> str:
    while len(run.created) < 3:
        data_of(run.create(), 200, 201, 202)
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        params = {"limit": "1", **({"cursor": cursor} if cursor else {})}
        page = data_of(run.client.get("/exports", params=params, headers=run.headers()), 200)
        items = page.get("items")
        expect(isinstance(items, list) and len(items) <= 1, f"limit=1 answered {items!r:.200}")
        seen += [str(i["task_id"]) for i in items]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    expect(len(seen) == len(set(seen)), "following next_cursor listed a task twice")
    missing = set(run.created) - set(seen)
    expect(not missing, f"following next_cursor never listed {sorted(missing)}")
    return f"{len(seen)} pages"


def cancel(run: Run) -> None:
    task_id = new_task_id(TASK_PREFIX)
    data_of(run.create(task_id), 200, 201, 202)
    resp = run.client.post(f"/exports/{task_id}/cancel", headers=run.headers())
    if resp.status_code == 409:  # it finished first: a terminal task is not cancelled, and says so
        expect(data_of(resp, 409)["status"] in TERMINAL, "a 409 to a cancel must carry the terminal task")
        return
    expect(data_of(resp, 200)["status"] == "CANCELLED", f"a cancel answered status {resp.json()['data']['status']}")
    again = run.client.post(f"/exports/{task_id}/cancel", headers=run.headers())
    expect(again.status_code == 200, f"a second cancel answered {again.status_code}, expected 200 (idempotent)")


def download_with_range(run: Run) -> str:
    if run.finished is None:
        raise Failed("no COMPLETED task to download (the progress check failed)")
    path = str((run.finished.get("result") or {}).get("download_url") or "")
    expect(path.startswith("/"), f"result.download_url {path!r} is not a path on the backend")
    whole = run.client.get(path, headers=run.headers())
    expect(whole.status_code == 200, f"GET {path} answered {whole.status_code}, expected 200")
    size = len(whole.content)
    expect(size >= 2, "the file is too small to check a Range on")
    part = run.client.get(path, headers={**run.headers(), "Range": "bytes=1-"})
    expect(part.status_code == 206, f"a Range request answered {part.status_code}, expected 206")
    expect(part.headers.get("content-range") == f"bytes 1-{size - 1}/{size}",
           f"Content-Range {part.headers.get('content-range')!r}, expected bytes 1-{size - 1}/{size}")
    expect(part.content == whole.content[1:], "the ranged bytes differ from the file's")
    return f"{size} bytes"


def change_feed(run: Run) -> str:
    with run.client.stream("GET", "/events", params={"follow": "false"}, timeout=5) as resp:
        expect(resp.status_code == 200, f"GET /events answered {resp.status_code}: the gateway polls instead")
        line = first_line(resp.iter_bytes(), time.monotonic() + FEED_WAIT_SEC)
    try:
        json.loads(line)
    except ValueError:
        raise Failed(f"the feed's first line is not JSON: {line[:100]!r}") from None
    return "served"


def first_line(chunks: Iterator[bytes], deadline: float) -> bytes:
    """The first line that is not blank, read within FEED_LINE_BYTES and by `deadline`: a feed that never ends
    a line (or trickles) fails the check rather than holding the run and its memory."""
    held = b""
    for chunk in chunks:
        held += chunk
        while b"\n" in held:
            line, held = held.split(b"\n", 1)
            if line.strip():
                return line
        expect(len(held) <= FEED_LINE_BYTES, f"the feed's first line passed {FEED_LINE_BYTES} bytes")
        expect(time.monotonic() < deadline, f"the feed sent no whole line within {FEED_WAIT_SEC:.0f} s")
    return held


REQUIRED: list[tuple[str, Callable[[Run], str | None]]] = [
    ("export types, with an ETag", export_types),
    ("create with the gateway's task id", create),
    ("idempotent and conflicting creates", idempotent_create),
    ("status fields and values", status_fields),
    ("progress, up to COMPLETED", progress),
    ("404 for an unknown id", unknown_id),
    ("400 without X-Tenant-Id", tenant_required),
    ("tenant isolation by X-Tenant-Id", tenant_isolation),
    ("list with a cursor", list_with_cursor),
    ("cancel", cancel),
    ("file download with Range", download_with_range),
]


def clean_up(run: Run) -> list[str]:
    """Cancel every task the run made that is still active; the ones that could not be."""
    left = []
    for task_id in run.created:
        try:
            resp = run.client.post(f"/exports/{task_id}/cancel", headers=run.headers())
        except httpx.HTTPError:
            left.append(task_id)
            continue
        if resp.status_code not in (200, 409):
            left.append(task_id)
    return left


class BoundedStream(httpx.SyncByteStream):
    """An answer's body, cut (ReadError) past ANSWER_BYTES or ANSWER_SEC: a backend answering without end, or
    trickling, fails the check rather than holding the run and its memory."""

    def __init__(self, inner: httpx.SyncByteStream) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        received, deadline = 0, time.monotonic() + ANSWER_SEC
        for chunk in self._inner:
            received += len(chunk)
            if received > ANSWER_BYTES or time.monotonic() > deadline:
                raise httpx.ReadError(f"the answer passed {ANSWER_BYTES} bytes or {ANSWER_SEC:.0f} s")
            yield chunk

    def close(self) -> None:
        self._inner.close()


class BoundedTransport(httpx.HTTPTransport):
    """The kit's transport: every answer's body is a BoundedStream."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream), "a blocking transport streams blocking"
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=BoundedStream(response.stream), extensions=response.extensions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--upstream", required=True, help="the backend's base URL, e.g. http://127.0.0.1:8081")
    parser.add_argument("--tenant", default="conformance", help="the tenant its tasks belong to")
    parser.add_argument("--token", default="", help="the backend's service token (sent as Authorization: Bearer)")
    parser.add_argument("--export-type", default="", help="the type its tasks use (default: the first listed)")


def run_checks(args: argparse.Namespace) -> int:
    """Every check against `args.upstream`, one line each; 0 when every required one passed, else 1."""
    auth = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.upstream.rstrip("/"), headers=auth, timeout=10,
                      transport=BoundedTransport()) as client:
        run = Run(client, args.tenant, f"{args.tenant}-other", args.export_type)
        for name, check in REQUIRED:
            run.report(name, check)
        run.report("change feed (GET /events)", change_feed, optional=True)
        left = clean_up(run)
    if left:
        print(f"could not cancel {len(left)} task(s) of tenant {args.tenant}: {', '.join(left)}")
    print(f"{len(REQUIRED) - run.failures} of {len(REQUIRED)} required checks passed")
    return 0 if run.failures == 0 else 1
