"""One `Range: bytes=...` header against an object of known size (RFC 9110, single ranges only)."""
from __future__ import annotations

import re

from exports_common.errors import ApiError, ErrorKind

_SINGLE = re.compile(r"^bytes=(\d*)-(\d*)$")


def requested_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, or None for the whole object.

    Another unit, several ranges, or a range whose last byte comes before its first (invalid,
    RFC 9110 14.1.1) are ignored, as the RFC says (the client gets the whole file with 200,
    and sees from the status that it is whole). A `bytes=` range that cannot be read is
    refused with 400 rather than ignored. A well-formed range wholly past the end answers 416.
    """
    if header is None or not header.strip().startswith("bytes=") or "," in header:
        return None
    match = _SINGLE.match(header.strip())
    if match is None or match.groups() == ("", ""):
        raise ApiError(ErrorKind.BAD_RANGE, data={"range": header[:100]})
    if all(match.groups()) and int(match[2]) < int(match[1]):
        return None
    first, last = match.groups()
    if not first:  # suffix: the last N bytes
        if int(last) == 0:
            raise _unsatisfiable(size)
        return max(0, size - int(last)), size - 1
    start = int(first)
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(int(last), size - 1) if last else size - 1


def _unsatisfiable(size: int) -> ApiError:
    return ApiError(ErrorKind.RANGE_NOT_SATISFIABLE, data={"size": size}, headers={"Content-Range": f"bytes */{size}"})
