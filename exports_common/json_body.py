"""Reading a JSON request body safely: type, size, syntax and nesting are checked before use."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from exports_common.errors import ApiError, ErrorKind, validation_error

MAX_DEPTH = 32


def is_json_content_type(value: str | None) -> bool:
    media = (value or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def read_limited(chunks: AsyncIterator[bytes], max_bytes: int, declared: str | None) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed max_bytes (declared or streamed)."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(ErrorKind.PAYLOAD_TOO_LARGE, f"the body must be at most {max_bytes} bytes")
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise ApiError(ErrorKind.PAYLOAD_TOO_LARGE, f"the body must be at most {max_bytes} bytes")
    return bytes(body)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def parse_json(body: bytes, content_type: str | None, max_depth: int = MAX_DEPTH) -> Any:
    if not is_json_content_type(content_type):
        raise ApiError(ErrorKind.UNSUPPORTED_MEDIA_TYPE)
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(ErrorKind.INVALID_JSON, f"the body is not valid JSON: {exc}"[:300]) from exc
    if _depth(value) > max_depth:
        raise validation_error("body", f"JSON nesting must be at most {max_depth} levels deep")
    return value
