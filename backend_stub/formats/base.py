"""What every output format provides: a streaming row writer over the attempt's binary output file."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol


@dataclass(frozen=True)
class WriteOptions:
    """The export type's settings that change how rows are written."""

    escape_formulas: bool = False  # CSV: a text cell starting with = + - @ gets a leading '


class RowWriter(Protocol):
    """Writes batches as they come (bounded memory), then `close()` ends the format (a footer, a flush).

    The output stream stays open: the caller owns it, compression and size accounting included."""

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OutputFormat:
    """One format, as a submit names it: its file extension is its name."""

    name: str
    media_type: str
    open: Callable[[BinaryIO, Sequence[str], WriteOptions], RowWriter]  # (output, columns, options)
