"""`GET /events`: the store's change log as a feed, for the gateways (all tenants; never for clients).

A gateway process holds one feed per upstream and pushes each task's changes to the
clients watching it. The answer is newline-delimited JSON (`application/x-ndjson`), one
object per line, in log order:

- `{"position": ID}`: every entry up to ID has been sent. First (where the feed starts),
  after each page read, and every `feed_heartbeat_sec` while nothing changes, so a reader
  tells a live feed from a dead connection. ID is "" while the log is empty.
- `{"id": ID, "task_id": ..., "tenant": ..., "task": {...}}`: one change; `task` is the
  task as `GET /exports/{id}` answers it, its `change_id` being ID.
- `{"gap": AFTER, "position": ID}`: entries after AFTER were trimmed (older than the log's
  retention): the reader lost changes, and the feed goes on after ID.

Query: `after` (a change id: start after it; omitted: at the current end), `tenant` (only
that tenant's entries; positions still move), `follow` (`true`, the default: wait for new
entries for ever; `false`: end once caught up, for a reader catching up after a break).

A tenant's catch-up (`tenant` with `follow=false`) reads at most `catch_up_max_entries` of the
log (every tenant's entries count: the log is one sequence); past that it answers a gap, and the
reader starts again from the current state. So one tenant's resumes, which a gateway sends on
its clients' behalf, cost the store a bounded read each, however old the id they resume from.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backend_stub.config import ChangeLogConfig
from backend_stub.store import TaskStore
from backend_stub.store.base import ChangeEntry, ChangeLogGap
from exports_common.errors import validation_error

MEDIA_TYPE = "application/x-ndjson"
PAGE = 500
PARAMS = frozenset({"after", "tenant", "follow"})


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def _entry(entry: ChangeEntry) -> bytes:
    return _line({"id": entry.change_id, "task_id": entry.task_id, "tenant": entry.tenant, "task": entry.task})


def _query(request: Request) -> tuple[str | None, str | None, bool]:
    seen: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in PARAMS:
            raise validation_error(name, f"unknown parameter; the feed takes {sorted(PARAMS)}")
        if name in seen:
            raise validation_error(name, "given more than once")
        seen[name] = value
    follow = seen.get("follow", "true")
    if follow not in ("true", "false"):
        raise validation_error("follow", "must be true or false")
    tenant = seen.get("tenant")
    if tenant is not None and not 0 < len(tenant) <= 128:
        raise validation_error("tenant", "1 to 128 characters")
    return seen.get("after"), tenant, follow == "true"


class ChangeFeed:
    def __init__(self, store: TaskStore, log: ChangeLogConfig) -> None:
        self.store = store
        self.heartbeat_sec = log.feed_heartbeat_sec
        self.catch_up_max_entries = log.catch_up_max_entries

    def _page_size(self, tenant: str | None, follow: bool, read: int) -> int:
        """How many entries to read next: a page, or what is left of a tenant's catch-up (0: none)."""
        if tenant is None or follow:
            return PAGE
        return min(PAGE, self.catch_up_max_entries - read)

    async def events(self, request: Request) -> Response:
        after, tenant, follow = _query(request)
        if after is None:
            after = await self.store.latest_change_id()
            first: list[ChangeEntry] = []
            opening = _line({"position": after or ""})
        else:
            try:  # read here, before the answer starts: a malformed id is the caller's 422, not a cut stream
                first = await self.store.changes(after, self._page_size(tenant, follow, 0))
                opening = _line({"position": after})
            except ValueError as exc:
                raise validation_error("after", str(exc)) from exc
            except ChangeLogGap:
                first, latest = [], await self.store.latest_change_id()
                opening = _line({"gap": after, "position": latest or ""})
                after = latest
        return StreamingResponse(self._lines(opening, first, after, tenant, follow), media_type=MEDIA_TYPE,
                                 headers={"Cache-Control": "no-store"})

    async def _lines(self, opening: bytes, page: list[ChangeEntry], after: str | None, tenant: str | None,
                     follow: bool) -> AsyncIterator[bytes]:
        yield opening
        read, size = 0, self._page_size(tenant, follow, 0)
        while True:
            if page:
                chunk = b"".join(_entry(e) for e in page if tenant is None or e.tenant == tenant)
                after = page[-1].change_id
                read += len(page)
                yield chunk + _line({"position": after})
            if len(page) < size and not follow:
                return
            size = self._page_size(tenant, follow, read)
            if size == 0:  # a tenant's catch-up this long costs more than a fresh start: the reader makes one
                latest = await self.store.latest_change_id()
                yield _line({"gap": after or "", "position": latest or ""})
                return
            try:
                page = await self.store.changes(after, size, wait_sec=self.heartbeat_sec if follow else 0.0)
            except ChangeLogGap:  # this reader fell behind the retention while reading: say so, go on at the end
                latest = await self.store.latest_change_id()
                yield _line({"gap": after or "", "position": latest or ""})
                page, after = [], latest
                continue
            if not page and follow:
                yield _line({"position": after or ""})

