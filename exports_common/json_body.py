"""Reading a JSON request body safely: type, size, syntax and nesting are checked before use."""
from __future__ import annotations

import json
import math
from typing import Any, AsyncIterator

from exports_common.errors import ApiError, ErrorKind, validation_error

MAX_DEPTH = 32


def is_json_content_type(value: str | None) -> bool:
    media = (value or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def too_large(max_bytes: int) -> ApiError:
    return ApiError(ErrorKind.PAYLOAD_TOO_LARGE, f"the body must be at most {max_bytes} bytes")


def refuse_declared_over(declared: str | None, max_bytes: int) -> None:
    """413 if the declared Content-Length is over max_bytes; a length that is not ASCII digits is left to the
    streamed count (`str.isdigit()` alone also takes '²' and other scripts' digits, which `int()` refuses)."""
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)


async def read_limited(chunks: AsyncIterator[bytes], max_bytes: int, declared: str | None) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed max_bytes (declared or streamed)."""
    refuse_declared_over(declared, max_bytes)
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    return bytes(body)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _check_tree(value: Any, max_depth: int) -> None:
    """Depth, and what JSON can spell but no consumer can use: lone surrogates and non-finite numbers.

    Python's parser accepts `"\\ud800"`, `NaN` and `1e999` (as infinity); each would
    fail later (encoding a reply, comparing rows), so all are refused here with the
    member's path named (a path never holds a surrogate: names are checked before their values).
    """
    stack: list[tuple[Any, int, str]] = [(value, 0, "body")]
    while stack:
        item, level, path = stack.pop()
        if isinstance(item, dict):
            if level + 1 > max_depth:
                raise validation_error("body", f"JSON nesting must be at most {max_depth} levels deep")
            for key, member in item.items():
                if _has_lone_surrogate(key):
                    raise validation_error(path, "a member name holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
                stack.append((member, level + 1, key if path == "body" else f"{path}.{key}"))
        elif isinstance(item, list):
            if level + 1 > max_depth:
                raise validation_error("body", f"JSON nesting must be at most {max_depth} levels deep")
            stack.extend((member, level + 1, f"{path}[{i}]") for i, member in enumerate(item))
        elif isinstance(item, str):
            if _has_lone_surrogate(item):
                raise validation_error(path, "holds a lone UTF-16 surrogate (\\ud800-\\udfff)")
        elif isinstance(item, float) and not math.isfinite(item):
            raise validation_error(path, "must be a finite number (no NaN, Infinity or overflow)")


def parse_json(body: bytes, content_type: str | None, max_depth: int = MAX_DEPTH) -> Any:
    if not is_json_content_type(content_type):
        raise ApiError(ErrorKind.UNSUPPORTED_MEDIA_TYPE)
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(ErrorKind.INVALID_JSON, f"the body is not valid JSON: {exc}"[:300]) from exc
    _check_tree(value, max_depth)
    return value
