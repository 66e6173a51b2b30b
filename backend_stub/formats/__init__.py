"""Output formats, one module each: a new one is its module (an `OutputFormat` named FORMAT) and a line below."""
from __future__ import annotations

from backend_stub.formats import csv, jsonl
from backend_stub.formats.base import OutputFormat, RowWriter, WriteOptions

FORMATS: dict[str, OutputFormat] = {f.name: f for f in (csv.FORMAT, jsonl.FORMAT)}
# the file as a source answered it (an endpoint's body), with the media type it came with: no rows, no writer
RAW = "raw"

__all__ = ["FORMATS", "RAW", "OutputFormat", "RowWriter", "WriteOptions"]
