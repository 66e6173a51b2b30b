"""An upstream answering each request with the status its path names, for the breaker tests.

Run as `python -m tests.status_upstream run --config FILE` (the file names the port), like the real services.
`GET /status/{code}/...`: that status with an envelope; `GET /calls`: how many such requests it has had.
"""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests import stub_server

counts = {"calls": 0}


async def status(request: Request) -> JSONResponse:
    counts["calls"] += 1
    code = int(request.path_params["code"])
    return JSONResponse({"code": code * 100 if code >= 400 else 0, "message": f"answered {code}", "data": None},
                        status_code=code)


async def calls(request: Request) -> JSONResponse:
    return JSONResponse({"code": 0, "message": "success", "data": counts})


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"code": 0, "message": "success", "data": {"status": "ok"}})


app = Starlette(routes=[Route("/healthz", healthz), Route("/calls", calls),
                        Route("/status/{code:int}/{rest:path}", status)])

if __name__ == "__main__":
    stub_server.serve(app, stub_server.config_from_args())
