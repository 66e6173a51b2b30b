"""One export attempt, run in a worker thread: query the data set, render CSV or JSONL, store the file.

It streams chunk by chunk, so memory stays flat whatever the row count, and it
checks its stop flag between chunks: those are the safe points where a cancel or
a timeout takes effect. Whatever stops it early, the partial file is removed.

A result store that fails (an outage) does not end the attempt: the finished file stays
in the spool and its upload is tried again with backoff (jittered, doubling up to 30 s)
until it lands or the job is stopped, which the task's timeout does in the end. A disk
that fills up while the file is written ends the attempt with `OutOfSpace`.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TextIO

from backend_stub import metrics
from backend_stub.config import ExportTypeConfig
from backend_stub.datasets import DATASETS, Row
from backend_stub.disk_space import OutOfSpace, no_space
from backend_stub.filters import compile_filters
from backend_stub.result_store import StoreUnavailable
from exports_common.contract import Format

CHUNK_ROWS = 5_000
STORE_RETRY_FIRST_SEC = 1.0
STORE_RETRY_MAX_SEC = 30.0
log = logging.getLogger("backend.export")


class Cancelled(Exception):
    """The job was told to stop (cancel, timeout, or lost lease)."""


class TransientFailure(Exception):
    """A failure worth another attempt (injected by the fault settings)."""


@dataclass(frozen=True)
class JobResult:
    rows: int
    bytes: int


Write = Callable[[list[Row]], Any]


def _csv(out: TextIO, columns: tuple[str, ...]) -> Write:
    writer = csv.writer(out)
    writer.writerow(columns)
    return writer.writerows


def _jsonl(out: TextIO, columns: tuple[str, ...]) -> Write:
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    return lambda chunk: out.write("".join(dumps(dict(zip(columns, row, strict=False))) + "\n" for row in chunk))


# one writer per format of the contract (a test checks none is missing)
WRITERS: dict[Format, Callable[[TextIO, tuple[str, ...]], Write]] = {Format.CSV: _csv, Format.JSONL: _jsonl}


class ExportJob:
    def __init__(
        self,
        spec: ExportTypeConfig,
        filters: dict[str, Any],
        fmt: str,
        part_path: Path,
        publish: Callable[[Path], None],
        fail_transiently: bool = False,
    ) -> None:
        self.spec = spec
        self.filters = filters
        self.fmt = fmt
        self.part_path = part_path
        self.publish = publish
        self.fail_transiently = fail_transiently
        self.step = "query"
        self.progress = 0
        self.store_outage: str | None = None  # the result store's last failure, while the upload waits it out
        self._stop = threading.Event()

    def cancel(self) -> None:
        self._stop.set()

    def run(self) -> JobResult:
        try:
            return self._run()
        except OSError as exc:
            self.part_path.unlink(missing_ok=True)
            if no_space(exc):
                raise OutOfSpace(f"no space left under data_dir for the export's file ({exc.strerror})") from exc
            raise
        except BaseException:
            self.part_path.unlink(missing_ok=True)
            raise

    def _pause(self, seconds: float) -> None:
        if self._stop.wait(seconds) if seconds > 0 else self._stop.is_set():
            raise Cancelled()

    def _run(self) -> JobResult:
        dataset = DATASETS[self.spec.dataset]
        predicate = compile_filters(self.spec.filters, dataset.columns, self.filters)
        rows = dataset.generate(self.spec.seed, self.spec.rows)
        total = self.spec.rows
        chunk_delay = self.spec.fault.delay_sec * min(1.0, CHUNK_ROWS / total)
        scanned = written = 0
        self.part_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.part_path, "w", newline="", encoding="utf-8", buffering=1 << 20) as out:
            write = WRITERS[Format(self.fmt)](out, dataset.columns)
            self.step = "render"
            while chunk := list(islice(rows, CHUNK_ROWS)):
                scanned += len(chunk)
                if predicate is not None:
                    chunk = [row for row in chunk if predicate(row)]
                write(chunk)
                written += len(chunk)
                self.progress = 5 + (90 * scanned) // total
                if self.fail_transiently and scanned * 2 >= total:
                    raise TransientFailure("injected transient failure")
                self._pause(chunk_delay)
            self.step = "store"
            out.flush()
            os.fsync(out.fileno())
        self._pause(0)
        size = self.part_path.stat().st_size
        self._store()
        self.progress = 99
        return JobResult(rows=written, bytes=size)

    def _store(self) -> None:
        """Publish the finished file, waiting out a store outage (with backoff) until it lands or the job stops."""
        delay = STORE_RETRY_FIRST_SEC
        while True:
            try:
                self.publish(self.part_path)
            except StoreUnavailable as exc:
                self.store_outage = str(exc)
                wait = random.uniform(delay / 2, delay)
                metrics.result_store_retries.inc()
                log.warning("the result store failed; the upload is tried again (no attempt is spent)",
                            extra={"file": self.part_path.name, "error": str(exc), "retry_in_sec": round(wait, 1)})
                self._pause(wait)
                delay = min(STORE_RETRY_MAX_SEC, delay * 2)
            else:
                self.store_outage = None
                return
