"""A reverse proxy in front of a real backend that a test steers, to order a gateway's calls exactly.

Run as `python -m tests.held_upstream run --config FILE` (the file names the port and the backend's URL), like
the real services. Everything is forwarded to the backend, except while a test says otherwise:
- POST /_steer/refuse_creates {"on": bool}: every create (POST /exports) answers 503 with Retry-After, as a
  backend whose store is down does, without reaching the backend;
- POST /_steer/hold_reads {"on": bool}: a task read (GET /exports/{id}) is forwarded, and its answer held until
  the test turns holding off; GET /_steer/held says how many answers wait.
"""
from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests import stub_server

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
settings = {"upstream": ""}
refusing = {"on": False}
holding = {"on": False, "waiting": 0}
released = asyncio.Event()


async def forward(request: Request) -> Response:
    path = request.url.path
    if request.method == "POST" and path == "/exports" and refusing["on"]:
        return JSONResponse({"code": 50300, "message": "the task store does not answer", "data": None},
                            status_code=503, headers={"Retry-After": "1"})
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    async with httpx.AsyncClient(base_url=settings["upstream"], timeout=30) as client:
        answer = await client.request(request.method, path, params=request.query_params, headers=headers,
                                      content=await request.body())
    if request.method == "GET" and path.startswith("/exports/") and holding["on"]:
        holding["waiting"] += 1
        await released.wait()
        holding["waiting"] -= 1
    kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
    return Response(answer.content, status_code=answer.status_code, headers=kept)


async def refuse_creates(request: Request) -> JSONResponse:
    refusing["on"] = bool((await request.json())["on"])
    return JSONResponse(refusing)


async def hold_reads(request: Request) -> JSONResponse:
    holding["on"] = bool((await request.json())["on"])
    if holding["on"]:
        released.clear()
    else:
        released.set()
    return JSONResponse(holding)


async def held(request: Request) -> JSONResponse:
    return JSONResponse(holding)


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
app = Starlette(routes=[
    Route("/healthz", healthz), Route("/_steer/refuse_creates", refuse_creates, methods=["POST"]),
    Route("/_steer/hold_reads", hold_reads, methods=["POST"]), Route("/_steer/held", held),
    Route("/{path:path}", forward, methods=METHODS),
])

if __name__ == "__main__":
    config = stub_server.config_from_args()
    settings["upstream"] = str(config["upstream"])
    stub_server.serve(app, config)
