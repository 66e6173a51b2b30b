"""Compression of a result file (an export type's `compression:`): how it is written, named and served.

A compressed result is stored and served as is: `<task_id>.csv.gz` as application/gzip,
with no Content-Encoding (the client gets the .gz file, not a transparently decoded one).
"""
from __future__ import annotations

import gzip
from typing import BinaryIO, Literal, cast

Compression = Literal["gzip"]
SUFFIXES: dict[str, str] = {"gzip": ".gz"}
MEDIA_TYPES: dict[str, str] = {"gzip": "application/gzip"}
GZIP_LEVEL = 6  # zlib's default: most of level 9's size at a fraction of its time


def compressing(raw: BinaryIO, compression: str) -> BinaryIO:
    """A stream writing into `raw` compressed; closing it ends the compressed stream, not `raw`.

    No file name and no time in the gzip header: the same rows give the same bytes on every attempt."""
    if compression == "gzip":
        return cast(BinaryIO, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0))
    raise ValueError(f"unknown compression {compression!r}")
