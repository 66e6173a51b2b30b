"""A tiny upstream for header tests: answers every request with what it received.

Run as `python -m tests.echo_upstream run --config FILE` (the file names the port), like the real services.
"""
from __future__ import annotations

import argparse

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


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
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    port = yaml.safe_load(open(args.config))["port"]
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
