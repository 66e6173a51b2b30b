"""A slow synchronous HTTP endpoint for the http-source tests, run as its own process (uvicorn).

Each path misbehaves in one way, per Idempotency-Key (so one task's attempts see a sequence):
- /ok?delay=S          waits S seconds, then 200 text/csv
- /refuse              400 with a message
- /later               429 with Retry-After: 2 on a key's first call, then as /ok
- /flaky               500 on a key's first call, then as /ok
- /hang                never answers; records when the caller closed the connection
- /big?mib=N           streams N MiB of bytes (application/octet-stream)
GET /calls lists every call: path, method, key, tenant, body, query, when it came and when its caller left.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

CSV = "region,total\neu-west,42\n"
calls: list[dict[str, Any]] = []


def _record(request: Request, body: bytes) -> dict[str, Any]:
    call = {"path": request.url.path, "method": request.method, "key": request.headers.get("idempotency-key"),
            "tenant": request.headers.get("x-tenant-id"), "body": body.decode(errors="replace"),
            "query": str(request.query_params), "at": time.time(), "left_at": None}
    calls.append(call)
    return call


def _seen_before(call: dict[str, Any]) -> bool:
    return any(c["key"] == call["key"] and c["path"] == call["path"] for c in calls[:-1])


async def _until_gone(request: Request, call: dict[str, Any]) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.05)
    call["left_at"] = time.time()


async def endpoint(request: Request) -> Response:
    call = _record(request, await request.body())
    kind = request.path_params["kind"]
    if kind == "refuse":
        return PlainTextResponse("region xx-north does not exist", status_code=400)
    if kind == "later" and not _seen_before(call):
        return PlainTextResponse("busy", status_code=429, headers={"Retry-After": "2"})
    if kind == "flaky" and not _seen_before(call):
        return PlainTextResponse("upstream database down", status_code=500)
    if kind == "hang":
        await _until_gone(request, call)
        return PlainTextResponse("too late")
    if kind == "big":
        chunk = b"x" * 65536
        count = int(request.query_params.get("mib", "1")) * 16

        async def body() -> Any:
            for _ in range(count):
                yield chunk
        return StreamingResponse(body(), media_type="application/octet-stream",
                                 headers={"Content-Length": str(count * len(chunk))})
    delay = float(request.query_params.get("delay", "0"))
    try:
        await asyncio.wait_for(_until_gone(request, call), delay)  # sleeps `delay`, noting a caller that left
    except TimeoutError:
        pass
    return PlainTextResponse(CSV, media_type="text/csv")


async def list_calls(request: Request) -> Response:
    return JSONResponse(calls)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/healthz", healthz), Route("/calls", list_calls),
                        Route("/{kind}", endpoint, methods=["GET", "POST"])])
