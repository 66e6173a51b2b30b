"""jsonl_events: an export source reading events from a JSON Lines file (source interface v1).

Each line is one event: `{"id": ..., "tenant": ..., "at": "2026-11-29T10:00:00Z", "kind": ..., "detail": ...}`.
An export yields the events of the task's tenant only (row-level scoping: a tenant never gets
another's events, whatever its filters), in file order, a batch at a time, so memory stays flat
whatever the file's size. The type's `options: {path: FILE}` names the file.

    export_types:
      events:
        source: {kind: python, entry_point: jsonl_events, options: {path: /var/data/events.jsonl}}
        formats: [jsonl, csv]
        filters:
          kind: {type: enum, column: kind, values: [login, export, delete], multiple: true}
          day_from: {type: date, column: day, op: gte}
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

BATCH_ROWS = 1000
COLUMNS = ["event_id", "day", "at", "kind", "detail"]


class Context(Protocol):
    """What the backend hands `open`: the attempt's context (interface v1) and the type's options."""

    @property
    def options(self) -> Mapping[str, Any]: ...

    @property
    def filters(self) -> Mapping[str, Any]: ...

    @property
    def tenant(self) -> str: ...

    def cancelled(self) -> bool: ...

    def set_step(self, step: str) -> None: ...

    def set_progress(self, percent: int) -> None: ...


class BadEvent(ValueError):
    """A line that is no event: the export fails (not retried) rather than skip it silently."""


class EventsReader:
    """One attempt's rows: the tenant's events in the file, read a batch at a time."""

    columns = COLUMNS

    def __init__(self, ctx: Context) -> None:
        path = ctx.options.get("path")
        if not isinstance(path, str) or not path:
            raise BadEvent("options.path must name the events file")
        self._ctx = ctx
        self._path = Path(path)
        self._file: IO[str] | None = None
        self._size = 0

    def __enter__(self) -> EventsReader:
        self._file = self._path.open(encoding="utf-8")
        self._size = max(1, self._path.stat().st_size)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._file is not None:
            self._file.close()

    def estimate_rows(self) -> int | None:
        return None  # the tenant's share of the file is not known before reading it: progress is by bytes read

    def batches(self) -> Iterator[list[tuple[Any, ...]]]:
        assert self._file is not None, "entered by the backend before batches()"
        self._ctx.set_step("read")
        wanted = self._kinds()
        read = 0
        while not self._ctx.cancelled() and (lines := list(islice(self._file, BATCH_ROWS))):
            rows = [row for row in map(self._row, lines) if row is not None and (wanted is None or row[3] in wanted)]
            read += sum(map(len, lines))  # characters: bytes for the ASCII most event files are
            self._ctx.set_progress(5 + 90 * min(read, self._size) // self._size)
            yield rows

    def _kinds(self) -> frozenset[str] | None:
        """The `kind` filter, used to read less (the backend applies every declared filter again anyway)."""
        kind = self._ctx.filters.get("kind")
        if kind is None:
            return None
        return frozenset(kind) if isinstance(kind, list) else frozenset([kind])

    def _row(self, line: str) -> tuple[Any, ...] | None:
        if not line.strip():
            return None
        try:
            event = json.loads(line)
            if event["tenant"] != self._ctx.tenant:
                return None
            at = str(event["at"])
            return (str(event["id"]), at[:10], at, str(event["kind"]),
                    None if event.get("detail") is None else json.dumps(event["detail"], sort_keys=True))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadEvent(f"not an event: {type(exc).__name__}") from None


class JsonlEvents:
    """The source the entry point names: interface version 1, fixed columns (filters are checked at load)."""

    api_version = 1
    columns = COLUMNS

    def open(self, ctx: Context) -> EventsReader:
        return EventsReader(ctx)


SOURCE = JsonlEvents()
