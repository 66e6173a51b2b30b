"""The list route's query (`status`, `limit`, `cursor`), checked the same way at the edge and in the backend.

Strict on purpose: ASCII digits only for `limit` (Python's `isdigit` also accepts
superscripts and other scripts' digits, which `int` then refuses), a cursor in
the alphabet the store writes, each parameter at most once.
"""
from __future__ import annotations

import re
from typing import Collection, NamedTuple
from urllib.parse import urlencode

from exports_common.contract import STATUSES
from exports_common.errors import validation_error
from exports_common.submit_body import shown_name

MAX_LIST_LIMIT = 500
DEFAULT_LIST_LIMIT = 50
PARAMS = frozenset({"status", "limit", "cursor"})
_LIMIT = re.compile(r"[0-9]{1,4}")
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,512}")  # unpadded base64url, as the stores write it


class ListQuery(NamedTuple):
    """A list call's checked parameters."""

    status: str | None
    limit: int
    cursor: str | None

    def encode(self) -> str:
        """The query string to send upstream: only the checked parameters."""
        return urlencode({name: value for name, value in self._asdict().items() if value is not None})


def check_list_query(params: list[tuple[str, str]], allowed: Collection[str] = PARAMS) -> ListQuery:
    """`params` as parsed from the query string, repeats kept; 422 naming the first bad parameter."""
    seen: dict[str, str] = {}
    for name, value in params:
        if name not in allowed:
            raise validation_error(shown_name(name), f"unknown query parameter; allowed: {sorted(allowed)}")
        if name in seen:
            raise validation_error(name, "give this query parameter once")
        seen[name] = value
    status = seen.get("status")
    if status is not None and status not in STATUSES:
        raise validation_error("status", f"must be one of {list(STATUSES)}")
    raw_limit = seen.get("limit", str(DEFAULT_LIST_LIMIT))
    if not _LIMIT.fullmatch(raw_limit) or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
        raise validation_error("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}")
    cursor = seen.get("cursor") or None
    if cursor is not None and not _CURSOR.fullmatch(cursor):
        raise validation_error("cursor", "must be the next_cursor of an earlier page")
    return ListQuery(status, int(raw_limit), cursor)
