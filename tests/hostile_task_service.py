"""A task service that answers the upstream contract's routes with garbage of the right status, for the attacks on
the conformance kit: run as its own process (uvicorn tests.hostile_task_service:app), told how by environment.

- SHAPE=wrong: every answer is a well-formed envelope whose `data` has the wrong shape (a string, a list, a
  progress that is text, items that are not objects);
- SHAPE=endless: like `wrong`, and `GET /events` answers 200 with one line that never ends;
- SHAPE=huge: like `wrong`, and `GET /export-types` answers 200 with a JSON body that never ends.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SHAPE = os.environ.get("SHAPE", "wrong")


def envelope(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"code": 0, "message": "success", "data": data}, status_code=status, headers=headers)


async def export_types(request: Request) -> Response:
    if SHAPE == "huge":
        return StreamingResponse(never_ends(b'{"code":0,"message":"success","data":{"items":["'),
                                 media_type="application/json")
    if request.headers.get("if-none-match") == '"v1"':
        return Response(status_code=304)
    return envelope({"items": [{"export_type": "report_export", "formats": ["csv"]}]}, headers={"ETag": '"v1"'})


async def create(request: Request) -> Response:
    return envelope("created", 201)


async def listing(request: Request) -> Response:
    return envelope({"items": ["not-a-task", 7], "next_cursor": None})


async def task(request: Request) -> Response:
    return envelope({"task_id": request.path_params["task_id"], "status": "RUNNING", "progress": "half",
                     "export_type": "report_export", "created_at": "2026-01-01T00:00:00Z"})


async def cancel(request: Request) -> Response:
    return envelope(["CANCELLED"])


async def events(request: Request) -> Response:
    if SHAPE != "endless":
        return Response(status_code=404)
    return StreamingResponse(never_ends(b""), media_type="application/x-ndjson")


async def never_ends(start: bytes) -> AsyncIterator[bytes]:
    yield start
    while True:
        yield b"x" * 65_536
        await asyncio.sleep(0)


async def healthz(request: Request) -> Response:
    return Response("ok")


app = Starlette(routes=[
    Route("/healthz", healthz), Route("/export-types", export_types), Route("/exports", create, methods=["POST"]),
    Route("/exports", listing), Route("/exports/{task_id}", task), Route("/events", events),
    Route("/exports/{task_id}/cancel", cancel, methods=["POST"]),
])
