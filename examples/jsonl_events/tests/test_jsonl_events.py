"""jsonl_events on its own: the source interface driven the way the backend drives it, with a context of ours."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from jsonl_events import SOURCE, BadEvent


class Ctx:
    def __init__(self, path: Path, tenant: str, filters: Mapping[str, Any] | None = None, stop_after: int = 10**9
                 ) -> None:
        self.options = {"path": str(path)}
        self.tenant = tenant
        self.filters = dict(filters or {})
        self.steps: list[str] = []
        self.progress = 0
        self._checks_left = stop_after

    def cancelled(self) -> bool:
        self._checks_left -= 1
        return self._checks_left < 0

    def set_step(self, step: str) -> None:
        self.steps.append(step)

    def set_progress(self, percent: int) -> None:
        self.progress = percent


def events_file(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "events.jsonl"
    with path.open("w") as out:
        for i in range(count):
            tenant = "acme" if i % 3 else "globex"
            kind = ("login", "export", "delete")[i % 3 if i % 2 else 0]
            out.write(json.dumps({"id": f"e{i}", "tenant": tenant, "at": f"2026-11-{1 + i % 28:02d}T10:00:00Z",
                                  "kind": kind, "detail": {"n": i} if i % 5 else None}) + "\n")
    return path


def read_all(ctx: Ctx) -> list[tuple[Any, ...]]:
    with SOURCE.open(ctx) as source:
        assert source.columns == ["event_id", "day", "at", "kind", "detail"]
        return [row for batch in source.batches() for row in batch]


def test_an_export_yields_the_tenants_events_in_file_order_in_batches(tmp_path: Path) -> None:
    path = events_file(tmp_path, 2500)
    rows = read_all(ctx := Ctx(path, "acme"))
    expected = [f"e{i}" for i in range(2500) if i % 3]
    assert [row[0] for row in rows] == expected
    assert rows[0] == ("e1", "2026-11-02", "2026-11-02T10:00:00Z", "export", '{"n": 1}')
    assert ctx.steps == ["read"] and ctx.progress == 95
    assert not {row[0] for row in rows} & {row[0] for row in read_all(Ctx(path, "globex"))}


def test_the_kind_filter_reads_less_and_a_cancel_stops_at_the_next_batch(tmp_path: Path) -> None:
    path = events_file(tmp_path, 2500)
    assert {row[3] for row in read_all(Ctx(path, "acme", {"kind": ["login"]}))} == {"login"}
    with SOURCE.open(Ctx(path, "acme", stop_after=1)) as source:
        assert len(list(source.batches())) == 1


def test_a_line_that_is_no_event_fails_the_export_without_echoing_it(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"id": "e1", "tenant": "acme", "at": "2026-11-01T00:00:00Z", "kind": "login"}\n'
                    '{"secret": "hunter2"}\n')
    with pytest.raises(BadEvent) as failed:
        read_all(Ctx(path, "acme"))
    assert "hunter2" not in str(failed.value)
