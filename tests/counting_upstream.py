"""An upstream that counts task reads: every task it is asked about has COMPLETED, answered after `delay_sec`.

Run as `python -m tests.counting_upstream run --config FILE` (the file names the port and the delay), like
the real services. GET /calls answers how many task reads it has received (counted when each arrives).
"""
from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests import stub_server

counts = {"reads": 0}
settings = {"delay_sec": 0.0}


def envelope(data: dict[str, object]) -> JSONResponse:
    return JSONResponse({"code": 0, "message": "success", "data": data})


async def task(request: Request) -> JSONResponse:
    counts["reads"] += 1
    await asyncio.sleep(settings["delay_sec"])
    now = "2026-12-01T00:00:00Z"
    return envelope({"task_id": request.path_params["task_id"], "export_type": "report_export",
                     "status": "COMPLETED", "progress": 100, "current_step": None, "attempt": 1,
                     "created_at": now, "updated_at": now, "result": None, "error": None, "degraded": False,
                     "callback": None})


async def calls(request: Request) -> JSONResponse:
    return envelope(dict(counts))


async def healthz(request: Request) -> JSONResponse:
    return envelope({"status": "ok"})


app = Starlette(routes=[Route("/healthz", healthz), Route("/calls", calls), Route("/exports/{task_id}", task)])

if __name__ == "__main__":
    config = stub_server.config_from_args()
    settings["delay_sec"] = float(config.get("delay_sec", 0.0))
    stub_server.serve(app, config)
