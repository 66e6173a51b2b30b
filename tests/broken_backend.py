"""A backend that breaks the upstream task contract in one way, for the conformance tests: a proxy in front of
a real backend, run as its own process (uvicorn tests.broken_backend:app), told what to break by environment:

- BREAK=tenant: ignores X-Tenant-Id (every request is made as tenant `conformance`);
- BREAK=task_id: answers a create under an id of its own, not the X-Task-Id it was sent;
- BREAK=range: drops Range from file requests (whole files, 200).
UPSTREAM is the real backend's URL.
"""
from __future__ import annotations

import os

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exports_common.task_ids import new_task_id

BREAK = os.environ["BREAK"]
UPSTREAM = os.environ["UPSTREAM"]
HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding"}


def broken(request: Request) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    if BREAK == "tenant" and request.url.path.startswith("/exports"):
        headers["x-tenant-id"] = "conformance"
    if BREAK == "task_id" and request.method == "POST" and request.url.path == "/exports":
        headers["x-task-id"] = new_task_id("other")
    if BREAK == "range":
        headers.pop("range", None)
    return headers


async def forward(request: Request) -> Response:
    async with httpx.AsyncClient(base_url=UPSTREAM, timeout=10) as client:
        answer = await client.request(request.method, request.url.path, params=request.query_params,
                                      headers=broken(request), content=await request.body())
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP | {"content-encoding"}}
    return Response(answer.content, status_code=answer.status_code, headers=headers)


app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "HEAD", "POST"])])
