"""The references the gateway is measured against, run as real processes like the product.

- bare:           a Starlette app answering the same JSON a cache hit returns (the ceiling for a hit);
- aiohttp_proxy:  the smallest useful proxy: one aiohttp session, path and query passed through;
- httpx_proxy:    the same with httpx's own pool (for the upstream client choice).

`python -m benchmarks.reference_servers run --config FILE`, FILE naming kind, port, upstream, body.
"""
from __future__ import annotations

import argparse
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

HEALTH = b'{"code":0,"message":"success","data":{"status":"ok"}}'


def bare_app(body: bytes) -> Starlette:
    async def answer(request: Request) -> Response:
        return Response(body, media_type="application/json", headers={"x-cache": "HIT"})

    async def health(request: Request) -> Response:
        return Response(HEALTH, media_type="application/json")

    return Starlette(routes=[Route("/healthz", health), Route("/{path:path}", answer)])


def aiohttp_proxy(upstream: str) -> Any:
    import aiohttp

    state: dict[str, aiohttp.ClientSession] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=200))
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await state["s"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in (b"host",)}
        query = scope["query_string"].decode()
        url = upstream + scope["path"] + (f"?{query}" if query else "")
        async with state["s"].get(url, headers=headers) as resp:
            body = await resp.read()
            out = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            await send({"type": "http.response.body", "body": body})

    return app


def httpx_proxy(upstream: str) -> Any:
    import httpx

    state: dict[str, httpx.AsyncClient] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            state["c"] = httpx.AsyncClient(limits=httpx.Limits(max_connections=200, max_keepalive_connections=200))
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await state["c"].aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in (b"host",)}
        resp = await state["c"].get(upstream + scope["path"], headers=headers)
        out = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
        await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
        await send({"type": "http.response.body", "body": resp.content})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--config", required=True)
    config = yaml.safe_load(open(parser.parse_args().config))
    kind = config["kind"]
    if kind == "bare":
        app = bare_app(open(config["body_file"], "rb").read())
    elif kind == "aiohttp_proxy":
        app = aiohttp_proxy(config["upstream"])
    else:
        app = httpx_proxy(config["upstream"])
    uvicorn.run(app, host="127.0.0.1", port=config["port"], log_level="warning", access_log=False,
                loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
