"""The JSON envelope every body uses: {"code": 0, "message": "success", "data": ...}."""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from starlette.exceptions import HTTPException
from starlette.responses import Response

from exports_common.errors import ApiError, ErrorKind

JSON_TYPE = "application/json"


def dumps(value: Any) -> bytes:
    # backslashreplace spells a lone surrogate (which UTF-8 cannot carry) as its JSON escape, \udXXX,
    # so an answer that echoes odd input is still valid JSON and never an encoding error
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def ok_body(data: Any) -> bytes:
    return dumps({"code": 0, "message": "success", "data": data})


def ok(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(ok_body(data), status_code=status, headers=dict(headers or {}), media_type=JSON_TYPE)


def error_body(err: ApiError) -> bytes:
    return dumps({"code": err.kind.code, "message": err.message, "data": err.data})


def error_response(err: ApiError) -> Response:
    return Response(error_body(err), status_code=err.kind.status, headers=err.headers, media_type=JSON_TYPE)


async def _api_error(request: object, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: object, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    kind = {404: ErrorKind.NOT_FOUND, 405: ErrorKind.METHOD_NOT_ALLOWED}.get(status, ErrorKind.BAD_REQUEST)
    return error_response(ApiError(kind, data=None, headers=getattr(exc, "headers", None)))


async def _unexpected(request: object, exc: Exception) -> Response:
    logging.getLogger("errors").exception("unhandled error", exc_info=exc)
    return error_response(ApiError(ErrorKind.INTERNAL))


def exception_handlers() -> dict[Any, Any]:
    """Starlette handlers that turn every failure into an envelope; never a stack trace."""
    return {ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected}
