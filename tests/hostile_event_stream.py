"""A gateway whose event streams misbehave, for the attacks on the SDK's `wait`: run as its own process
(uvicorn tests.hostile_event_stream:app), told how by environment. Polling the task's status answers it
COMPLETED, so a client that gives the stream up and polls finishes.

- STREAM=endless_line: 200 text/event-stream, one line that never ends;
- STREAM=endless_event: 200 text/event-stream, `data:` lines for ever, never the blank line that ends an event;
- STREAM=garbage_data: 200 text/event-stream, a `status` event whose data is not JSON, for ever;
- STREAM=trickle: 200 text/event-stream, a short `data:` line every 0.05 s, never an event's end;
- STREAM=odd_id: 200 text/event-stream, one RUNNING status event whose id is not ASCII, then the end.
`/stats` counts the stream opens and the polls.
"""
from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

STREAM = os.environ.get("STREAM", "endless_line")
COUNTS = {"streams": 0, "polls": 0}
PIECES = {"endless_line": b"x" * 65_536, "endless_event": b"data: " + b"x" * 65_530 + b"\n",
          "garbage_data": b"event: status\ndata: {not json\n\n", "trickle": b"data: x\n"}
PAUSES = {"garbage_data": 0.05, "trickle": 0.05}


async def events(request: Request) -> Response:
    COUNTS["streams"] += 1
    if STREAM == "odd_id":
        running = json.dumps({"code": 0, "message": "success", "data": task(request.path_params["task_id"], "RUNNING")})
        return Response(f"id: caf\u00e9-1\nevent: status\ndata: {running}\n\n".encode(), media_type="text/event-stream")
    piece = PIECES[STREAM]

    async def body() -> AsyncIterator[bytes]:
        yield b"retry: 100\n\n"
        while True:
            yield piece
            await asyncio.sleep(PAUSES.get(STREAM, 0.001))

    return StreamingResponse(body(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


def task(task_id: str, status: str) -> dict[str, object]:
    return {"task_id": task_id, "export_type": "report_export", "status": status,
            "progress": 100 if status == "COMPLETED" else 50, "current_step": None, "attempt": 1,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "result": None, "error": None}


async def status(request: Request) -> Response:
    COUNTS["polls"] += 1
    return JSONResponse({"code": 0, "message": "success", "data": task(request.path_params["task_id"], "COMPLETED")})


async def stats(request: Request) -> Response:
    return JSONResponse(COUNTS)


app = Starlette(routes=[Route("/api/v1/exports/{task_id}/events", events), Route("/api/v1/exports/{task_id}", status),
                        Route("/stats", stats)])
