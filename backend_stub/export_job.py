"""One export attempt, run in a worker thread: rows from the type's source, through its format's writer, stored.

Any source is driven the same way: opened with the attempt's context, read batch by
batch into the writer, so memory stays flat whatever the row count. Between two
batches are the safe points: a cancel, the task's deadline, `max_rows` and
`max_bytes` take effect there. Progress is 5 + 90 * rows written / the source's
estimate (or what the source reports itself), at most 95 until the file is stored.
Whatever stops the attempt early, its partial file is removed.

A result store that fails (an outage) does not end the attempt: the finished file stays
in the spool and its upload is tried again with backoff (jittered, doubling up to 30 s)
until it lands or the attempt is stopped, which the task's deadline does in the end. A
disk that fills up while the file is written ends the attempt with `OutOfSpace`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend_stub import metrics
from backend_stub.config import ExportTypeConfig
from backend_stub.disk_space import OutOfSpace, no_space
from backend_stub.failures import Cancelled, DeadlineReached, PermanentFailure, TransientFailure
from backend_stub.formats import FORMATS, WriteOptions
from backend_stub.models import Task
from backend_stub.part_file import PartFile
from backend_stub.result_store import StoreUnavailable
from backend_stub.sources import BODY_KINDS, Batch, BodyKind, SourceKind, TextValuesKind, TypedSource
from exports_common.backoff import backoff
from exports_common.netpolicy import AddressPolicy

RUNNING_MAX_PROGRESS = 95  # until the file is stored
STORED_PROGRESS = 99  # COMPLETED is 100
STORE_RETRY_FIRST_SEC = 1.0
STORE_RETRY_MAX_SEC = 30.0
log = logging.getLogger("backend.export")


@dataclass(frozen=True)
class JobResult:
    rows: int
    bytes: int
    media_type: str | None = None  # a raw result's, as its source answered it


class AttemptContext:
    """The `SourceContext` of one attempt; its step and progress are what the worker reports for the task."""

    def __init__(self, task: Task, deadline: float, stop: threading.Event) -> None:
        self.filters: Mapping[str, Any] = task.filters
        self.tenant = task.tenant
        self.task_id = task.task_id
        self.attempt = task.attempt
        self.deadline = deadline
        self.step = "query"
        self.progress = 0
        self._stop = stop

    def cancelled(self) -> bool:
        return self._stop.is_set() or time.monotonic() >= self.deadline

    def set_step(self, step: str) -> None:
        self.step = str(step)

    def set_progress(self, percent: int) -> None:
        self.progress = max(self.progress, min(RUNNING_MAX_PROGRESS, int(percent)))


class ExportJob:
    def __init__(
        self,
        spec: ExportTypeConfig,
        task: Task,
        deadline: float,
        part_path: Path,
        publish: Callable[[Path], None],
        fail_transiently: bool = False,
        network: AddressPolicy | None = None,
    ) -> None:
        """`deadline`: when the task times out, on the monotonic clock; `network`: the addresses a source may
        connect to (sources.allow_hosts / allow_networks; default: public ones only)."""
        self.spec = spec
        self.network = network or AddressPolicy()
        self.task = task
        self.part_path = part_path
        self.publish = publish
        self.fail_transiently = fail_transiently
        self.store_outage: str | None = None  # the result store's last failure, while the upload waits it out
        self._stop = threading.Event()
        self.ctx = AttemptContext(task, deadline, self._stop)

    @property
    def step(self) -> str:
        return self.ctx.step

    @property
    def progress(self) -> int:
        return self.ctx.progress

    def cancel(self) -> None:
        self._stop.set()

    def run(self) -> JobResult:
        try:
            return self._run()
        except TransientFailure as exc:
            self.part_path.unlink(missing_ok=True)
            if exc.wait_sec > 0 and self._attempts_left():
                self._pause(exc.wait_sec)  # the next attempt may not start sooner: this one holds the task till then
            raise
        except OSError as exc:
            self.part_path.unlink(missing_ok=True)
            if no_space(exc):
                raise OutOfSpace(f"no space left under data_dir for the export's file ({exc.strerror})") from exc
            raise
        except BaseException:
            self.part_path.unlink(missing_ok=True)
            raise

    def _run(self) -> JobResult:
        source = self.spec.source
        with PartFile(self.part_path, self.task.compression) as part:
            if isinstance(source, BODY_KINDS):
                rows, media_type = 0, self._copy_body(source, part)
            else:
                rows, media_type = self._write_rows(source, part), None
            self.ctx.set_step("store")
            size = part.finish()
        self._check_bytes(size)
        self._pause(0)
        self._store()
        self.ctx.progress = STORED_PROGRESS
        return JobResult(rows=rows, bytes=size, media_type=media_type)

    def _write_rows(self, kind: SourceKind, part: PartFile) -> int:
        """The source's rows through the task's format into `part`; how many were written."""
        spec, ctx = self.spec, self.ctx
        output = FORMATS.get(self.task.format)
        if output is None:
            raise PermanentFailure("FORMAT_UNAVAILABLE", f"this backend no longer writes {self.task.format!r}")
        opened = (kind.open_text_values(ctx, spec.filters) if output.text_values and isinstance(kind, TextValuesKind)
                  else kind.open(ctx, spec.filters))
        with opened as source:
            types = source.column_types() if isinstance(source, TypedSource) else None
            writer = output.open(part.stream, source.columns, WriteOptions(spec.csv_escape_formulas, types))
            estimate = source.estimate_rows()
            ctx.set_step("render")
            started, written = time.monotonic(), 0
            for batch in source.batches():
                self._check_row_width(batch, len(source.columns))
                written += len(batch)
                self._check_rows(written)
                writer.write(batch)
                self._check_bytes(part.stored_bytes())
                if estimate:
                    ctx.set_progress(5 + 90 * min(written, estimate) // estimate)
                self._fault(started)
            writer.close()
            self._fault(started, finished=True)
        return written

    def _copy_body(self, kind: BodyKind, part: PartFile) -> str:
        """The source's answer into `part` as it arrives; its media type."""
        ctx = self.ctx
        ctx.set_step("call")
        with kind.open_body(ctx, self.network) as body:
            ctx.set_step("receive")
            received = 0
            for chunk in body.chunks():
                part.stream.write(chunk)
                received += len(chunk)
                self._check_bytes(part.stored_bytes())
                if body.length:
                    ctx.set_progress(5 + 90 * min(received, body.length) // body.length)
        return body.media_type

    def _attempts_left(self) -> bool:
        return self.task.attempt - self.task.base_attempt + 1 < self.spec.max_attempts

    def _store(self) -> None:
        """Publish the finished file, waiting out a store outage (with backoff) until it lands or the job stops."""
        failures = 0
        while True:
            try:
                self.publish(self.part_path)
            except StoreUnavailable as exc:
                self.store_outage = str(exc)
                wait = backoff(failures, STORE_RETRY_FIRST_SEC, STORE_RETRY_MAX_SEC)
                failures += 1
                metrics.result_store_retries.inc()
                log.warning("the result store failed; the upload is tried again (no attempt is spent)",
                            extra={"task_id": self.task.task_id, "error": str(exc), "retry_in_sec": round(wait, 1)})
                self._pause(wait)
            else:
                self.store_outage = None
                return

    def _pause(self, seconds: float) -> None:
        """A safe point: wait up to `seconds`, stopping the attempt if it was cancelled or its deadline passed."""
        remaining = self.ctx.deadline - time.monotonic()
        if self._stop.wait(min(seconds, remaining)) if seconds > 0 and remaining > 0 else self._stop.is_set():
            raise Cancelled()
        if time.monotonic() >= self.ctx.deadline:
            raise DeadlineReached()

    def _fault(self, started: float, finished: bool = False) -> None:
        """The type's injected faults: its delay spread over the rows as they progress, a transient failure midway."""
        fault = self.spec.fault
        done = 1.0 if finished else max(0, self.ctx.progress - 5) / 90
        if self.fail_transiently and done >= 0.5:
            raise TransientFailure("injected transient failure")
        self._pause(started + fault.delay_sec * done - time.monotonic())

    def _check_row_width(self, batch: Batch, width: int) -> None:
        if batch and set(map(len, batch)) != {width}:
            raise PermanentFailure("SOURCE_ERROR", f"the source yielded a row whose values do not match its "
                                                   f"{width} columns: its author should fix it")

    def _check_rows(self, written: int) -> None:
        limit = self.spec.max_rows
        if limit is not None and written > limit:
            raise PermanentFailure("EXPORT_TOO_LARGE", f"the export has more than {limit} rows, the most export type "
                                                       f"{self.task.export_type} allows: narrow the filters")

    def _check_bytes(self, size: int) -> None:
        limit = self.spec.max_bytes
        if limit is not None and size > limit:
            raise PermanentFailure("EXPORT_TOO_LARGE", f"the export's file passed {limit} bytes, the most export "
                                                       f"type {self.task.export_type} allows: narrow the filters")
