"""The export job drives any source through the source interface: progress, steps, safe points, limits.

In process, with small sources written against the interface here (the synthetic kind runs through
the real backend in test_export_types.py).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from backend_stub.config import ExportTypeConfig
from backend_stub.export_job import ExportJob
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure
from backend_stub.filters import FilterSpec
from backend_stub.models import Task
from backend_stub.sources import Batch, RowSource, SourceContext

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it


class CountingSource(RowSource):
    """`batches` batches of `size` rows; notes what the job reported before each batch was handed over."""

    def __init__(self, ctx: SourceContext, batches: int, size: int, estimate: int | None,
                 on_second: Callable[[], None] | None) -> None:
        self.columns = ["n", "text"]
        self.ctx = ctx
        self.count, self.size, self.estimate = batches, size, estimate
        self.on_second = on_second
        self.seen: list[tuple[str, int]] = []
        self.closed = False

    def estimate_rows(self) -> int | None:
        return self.estimate

    def batches(self) -> Iterator[Batch]:
        for i in range(self.count):
            self.seen.append((self.ctx.step, self.ctx.progress))  # type: ignore[attr-defined]
            if i == 1 and self.on_second is not None:
                self.on_second()
            yield [(i * self.size + j, "x") for j in range(self.size)]
        self.seen.append((self.ctx.step, self.ctx.progress))  # type: ignore[attr-defined]

    def close(self) -> None:
        self.closed = True


class CountingKind:
    """A source kind as a config model would be one, holding what it opened so the test can look at it."""

    kind = "counting"

    def __init__(self, batches: int = 4, size: int = 10, estimate: int | None = 40,
                 on_second: Callable[[], None] | None = None, wide: bool = False) -> None:
        self.args = (batches, size, estimate, on_second)
        self.wide = wide
        self.opened: CountingSource | None = None

    def known_columns(self) -> Sequence[str]:
        return ["n", "text"]

    def expected_rows(self) -> int | None:
        return None

    def open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> CountingSource:
        assert ctx.step == "query" and ctx.filters == {"k": 1} and ctx.tenant == "t1"  # type: ignore[attr-defined]
        self.opened = CountingSource(ctx, *self.args)
        if self.wide:
            self.opened.columns = ["n"]
        return self.opened


def job_for(kind: CountingKind, tmp_path: Path, deadline_in: float = 60.0, **type_fields: Any) -> ExportJob:
    spec = ExportTypeConfig.model_construct(source=kind, **type_fields)  # type: ignore[arg-type]
    task = Task(task_id="exp-20260101-aaaaaaaaaaaaaaaa", tenant="t1", export_type="counting", filters={"k": 1},
                format="csv", timeout_sec=60, callback_url=None, fingerprint="", created_at=0.0, updated_at=0.0)
    published: list[Path] = []
    return ExportJob(spec, task, time.monotonic() + deadline_in, tmp_path / "task.part", published.append)


def test_progress_is_rows_written_over_the_estimate_and_stays_at_most_95_until_stored(tmp_path: Path) -> None:
    kind = CountingKind(batches=4, size=10, estimate=20)  # the source underestimates: 40 rows come
    job = job_for(kind, tmp_path)
    result = job.run()
    assert kind.opened is not None and kind.opened.closed
    assert kind.opened.seen == [("render", 0), ("render", 50), ("render", 95), ("render", 95), ("render", 95)]
    assert job.progress == 99 and job.step == "store"
    assert result.rows == 40 and result.bytes == (tmp_path / "task.part").stat().st_size


def test_a_source_that_reports_its_own_progress_never_moves_it_back() -> None:
    from backend_stub.export_job import AttemptContext

    task = Task(task_id="exp-20260101-aaaaaaaaaaaaaaaa", tenant="t1", export_type="x", filters={}, format="csv",
                timeout_sec=1, callback_url=None, fingerprint="", created_at=0.0, updated_at=0.0)
    ctx = AttemptContext(task, time.monotonic() + 60, threading.Event())
    for percent in (30, 10, 120):
        ctx.set_progress(percent)
    assert ctx.progress == 95


def test_a_source_that_ignores_cancel_is_stopped_at_its_next_batch_and_closed(tmp_path: Path) -> None:
    jobs: list[ExportJob] = []

    def cancel() -> None:  # as a cancel arriving while the source reads its second batch
        jobs[0].cancel()

    kind = CountingKind(batches=1000, size=10, on_second=cancel)
    jobs.append(job_for(kind, tmp_path))
    with pytest.raises(Cancelled):
        jobs[0].run()
    assert kind.opened is not None and kind.opened.closed
    assert len(kind.opened.seen) == 2  # the batch it was reading is the last one asked for
    assert not (tmp_path / "task.part").exists()


def test_the_deadline_stops_the_attempt_between_batches(tmp_path: Path) -> None:
    kind = CountingKind(batches=5, size=10)
    job = job_for(kind, tmp_path, deadline_in=-1.0)
    with pytest.raises(DeadlineReached):
        job.run()
    assert kind.opened is not None and len(kind.opened.seen) == 1 and kind.opened.closed
    assert not (tmp_path / "task.part").exists()


@pytest.mark.parametrize("fields,code", [
    ({"max_rows": 25}, "EXPORT_TOO_LARGE"), ({"max_bytes": 100}, "EXPORT_TOO_LARGE"), ({}, "SOURCE_ERROR")])
def test_limits_and_a_malformed_row_fail_the_attempt_for_good(tmp_path: Path, fields: dict[str, Any],
                                                               code: str) -> None:
    kind = CountingKind(batches=4, size=10, wide=not fields)  # the malformed source declares one column
    with pytest.raises(PermanentFailure) as failure:
        job_for(kind, tmp_path, **fields).run()
    assert failure.value.code == code
    assert ("export type counting allows" in str(failure.value)) == (code == "EXPORT_TOO_LARGE")
    assert not (tmp_path / "task.part").exists()
