"""A slow report service: an ordinary endpoint that takes a while to answer, as `source: {kind: http}` wraps.

`POST /report` with a JSON object of filters answers after SLOW_REPORT_DELAY_SEC (default 5) with a
CSV report. It honours `Idempotency-Key` as an endpoint behind the gateway should: a repeated key
gets the answer stored for it (a key whose first call is still running waits for that one), so
the work is never done twice for one task.

    uvicorn --app-dir examples slow_report:app --port 8082
"""
from __future__ import annotations

import asyncio
import os
from collections import OrderedDict

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

DELAY_SEC = float(os.environ.get("SLOW_REPORT_DELAY_SEC", "5"))
KEPT_ANSWERS = 10_000  # the oldest key is forgotten first
answers: OrderedDict[str, asyncio.Task[str]] = OrderedDict()


async def build_report(filters: dict[str, object]) -> str:
    await asyncio.sleep(DELAY_SEC)  # the slow part: a real service queries, aggregates, renders
    region = str(filters.get("region", "all"))
    return "region,orders,revenue\n" + "".join(f"{region},{100 + day},{1000 * day}.50\n" for day in range(1, 8))


async def report(request: Request) -> Response:
    filters = await request.json() if await request.body() else {}
    if not isinstance(filters, dict):
        return PlainTextResponse("the body must be a JSON object of filters", status_code=400)
    key = request.headers.get("idempotency-key")
    if key is None:
        return PlainTextResponse(await build_report(filters), media_type="text/csv")
    if key not in answers:
        answers[key] = asyncio.create_task(build_report(filters))
        while len(answers) > KEPT_ANSWERS:
            answers.popitem(last=False)
    return PlainTextResponse(await asyncio.shield(answers[key]), media_type="text/csv")


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


app = Starlette(routes=[Route("/report", report, methods=["POST"]), Route("/healthz", healthz)])
