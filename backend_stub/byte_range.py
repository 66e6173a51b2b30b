"""One `Range: bytes=...` header against an object of known size (RFC 9110, single ranges only)."""
from __future__ import annotations

import re

from exports_common.errors import ApiError, ErrorKind

_SINGLE = re.compile(r"^bytes=(\d*)-(\d*)$")


def requested_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, or None for the whole object.

    A header that is not one well-formed byte range is ignored, as the RFC allows (the client
    gets the whole file with 200); a well-formed range wholly past the end answers 416.
    """
    match = _SINGLE.match(header.strip()) if header else None
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if not first:  # suffix: the last N bytes
        if int(last) == 0:
            raise _unsatisfiable(size)
        return max(0, size - int(last)), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, end


def _unsatisfiable(size: int) -> ApiError:
    return ApiError(ErrorKind.RANGE_NOT_SATISFIABLE, data={"size": size}, headers={"Content-Range": f"bytes */{size}"})
