"""A route's upstream path from its `rewrite` and the request's path params.

Each param is encoded as one path segment (RFC 3986 3.3): a `?`, `#`, `/` or `%` in a
param cannot start a query, cut the path or climb out of it. A `{name:path}` param keeps
its `/`, each of its segments encoded. A `.` or `..` segment is refused with 404: it
would name another upstream path. A rewrite starts with `/` (checked when the config
loads), so what follows the upstream's URL is always a path: its origin is never the
client's to choose.
"""
from __future__ import annotations

import functools
from urllib.parse import quote

from starlette.convertors import PathConvertor
from starlette.routing import compile_path

from exports_common.errors import ApiError, ErrorKind

# what a path segment may hold as it is (RFC 3986 pchar, less `%`, which is always encoded)
SEGMENT_SAFE = "!$&'()*+,;=:@"
PATH_SAFE = SEGMENT_SAFE + "/"
DOT_SEGMENTS = frozenset({".", ".."})


@functools.lru_cache(maxsize=256)
def multi_segment_params(path: str) -> frozenset[str]:
    """The params of a route path that may span segments (`{name:path}`)."""
    return frozenset(name for name, convertor in compile_path(path)[2].items() if isinstance(convertor, PathConvertor))


@functools.lru_cache(maxsize=1024)  # a client asks for the same few paths again and again
def encode_segments(value: str, keep_slash: bool) -> str:
    """`value` as one path segment (or, `keep_slash`, as segments); a dot segment is a 404."""
    if not DOT_SEGMENTS.isdisjoint(value.split("/") if keep_slash else (value,)):
        raise ApiError(ErrorKind.NOT_FOUND, "a path may not hold a '.' or '..' segment")
    return quote(value, safe=PATH_SAFE if keep_slash else SEGMENT_SAFE)


def fill(rewrite: str, params: dict[str, str], multi: frozenset[str] = frozenset()) -> str:
    """The upstream path: `rewrite` with each param encoded (`multi`: the params that keep their `/`)."""
    return rewrite.format_map({name: encode_segments(value, name in multi) for name, value in params.items()})
