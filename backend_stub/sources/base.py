"""The source interface (v1): what an export reads its rows from, whatever the kind.

The export job opens a source for each attempt, in its worker thread, with a context
describing the attempt, then pulls batches of rows until the source is exhausted:

    with kind.open(ctx, type_filters) as source:
        writer.header(source.columns)
        for batch in source.batches():
            ...  # written, counted, checked against limits; cancel and timeout take effect here

A `SourceKind` is the config model of one `source: {kind: ...}` block (one module
per kind in this package); a `Source` is what it opens for one attempt. Python
source plugins implement the same `Source` and receive the same `SourceContext`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from backend_stub.filters import FilterSpec
from backend_stub.formats.base import ColumnType
from exports_common.netpolicy import AddressPolicy

API_VERSION = 1
Batch = list[tuple[Any, ...]]


class SourceContext(Protocol):
    """The attempt a source serves. `filters` are the submitted values, already validated against the type."""

    @property
    def filters(self) -> Mapping[str, Any]: ...

    @property
    def tenant(self) -> str: ...

    @property
    def task_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def deadline(self) -> float:
        """When the task times out, on the `time.monotonic()` clock: a query should not outlive it."""

    def cancelled(self) -> bool:
        """True once the attempt should stop (cancel, timeout, lost lease); a source that ignores it is
        stopped at its next batch anyway."""

    def set_step(self, step: str) -> None:
        """The task's `current_step`, for a source whose work has phases of its own."""

    def set_progress(self, percent: int) -> None:
        """Progress for a source that knows better than rows written / `estimate_rows()` (never goes back)."""


class Source(Protocol):
    """One attempt's rows: a context manager, closed when the attempt ends however it ends."""

    columns: list[str]

    def estimate_rows(self) -> int | None:
        """How many rows `batches()` will yield, if the source can tell (progress is written / estimate)."""

    def batches(self) -> Iterator[Batch]:
        """The rows, in order, a batch at a time; each row a tuple with one value per column.

        A batch may be empty: it still gives the job a point to stop at, so a source that filters
        long stretches away should yield now and then."""

    def __enter__(self) -> Source: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None: ...


class SourceKind(Protocol):
    """A `source:` block as configured: the config model of one kind, and how it opens for an attempt."""

    @property
    def kind(self) -> str: ...

    def known_columns(self) -> Sequence[str] | None:
        """The columns, when known from the config alone (filters are checked against them at load);
        None when only the source itself can tell (checked when it opens)."""

    def expected_rows(self) -> int | None:
        """Rows an unfiltered export yields, for the completion estimate a submit answers with; None: unknown."""

    def open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> Source:
        """The rows of one attempt. `filters`: the type's filter declarations (names to columns and ops)."""


class Body(Protocol):
    """One attempt's result as bytes rather than rows (format `raw`): a context manager, closed however it ends."""

    media_type: str  # what the download is served as
    length: int | None  # the size, when known in advance (for progress)

    def chunks(self) -> Iterator[bytes]: ...

    def __enter__(self) -> Body: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None: ...


@runtime_checkable
class BodyKind(Protocol):
    """A source kind whose result is a file as it comes (an endpoint's answer), not rows: it offers `raw` only.

    `network` says which addresses it may connect to (sources.allow_hosts / allow_networks)."""

    @property
    def kind(self) -> str: ...

    def open_body(self, ctx: SourceContext, network: AddressPolicy) -> Body: ...


class RowSource:
    """A convenient base for a `Source`: a context manager that calls `close()`, with no estimate."""

    columns: list[str]

    def estimate_rows(self) -> int | None:
        return None

    def batches(self) -> Iterator[Batch]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what `open` acquired (a connection, a cursor); called once, also after a failure."""

    def __enter__(self) -> RowSource:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


@runtime_checkable
class TypedSource(Protocol):
    """A source that knows its columns' types (a database's), which typed formats (Parquet) then keep."""

    def column_types(self) -> Sequence[ColumnType] | None: ...


@runtime_checkable
class TextValuesKind(Protocol):
    """A source kind that can hand dates, timestamps and decimals over already as the text formats write them
    (a database's own text: no conversion per value in Python). A decimal column's values are then `str`; its
    declared type (`TypedSource`) says it is a decimal."""

    def open_text_values(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> Source: ...


@runtime_checkable
class CheckedAtLoad(Protocol):
    """A source kind that checks itself against what it reads when the config loads (a database's columns)."""

    def check_at_load(self, filters: Mapping[str, FilterSpec]) -> list[str]:
        """ValueError when the config cannot work; else its warnings (each a sentence following the type's name)."""
