"""A tiny upstream for header tests: answers every request with what it received.

Run as `python -m tests.echo_upstream run --config FILE` (the file names the port), like the real services.
"""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests import stub_server


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"code": 0, "message": "success", "data": {
        "method": request.method, "path": request.url.path, "query": request.url.query,
        "headers": [[k, v] for k, v in request.headers.items()], "body_bytes": len(body),
    }}, headers={"Connection": "keep-alive, X-Secret-Hop", "X-Secret-Hop": "1", "Keep-Alive": "timeout=5"})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"code": 0, "message": "success", "data": {"status": "ok"}})


app = Starlette(routes=[Route("/healthz", healthz), Route("/{path:path}", echo, methods=["GET", "POST", "PUT"])])

if __name__ == "__main__":
    stub_server.serve(app, stub_server.config_from_args())
