"""Cost of the connection bounds (issue 9): uvicorn's httptools protocol vs the bounded subclass, per request.

Both protocols serve the same keep-alive connection in process (a transport that
records writes, an ASGI app answering a cache hit's size of JSON), the request a
status poll with its usual headers, one read per request as wrk sends it. Rounds
alternate between the two (and their order) so that load on the machine falls on both
alike (CPU time of this process is measured); the figure is the median over rounds of
bounded time / plain time. On a loaded machine count instructions instead, which load
does not move (benchmarks/RESULTS.md has the callgrind command).

Run: python -m benchmarks.bench_protocol [--requests 20000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from exports_common.connection_limits import ConnectionLimits, bounded_http

REQUEST = (b"GET /api/v1/exports/exp-20261129-zduz1x38ne0ej4zci11s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
           b"Authorization: Bearer 0123456789abcdef0123456789abcdef\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n")
BODY = b'{"code":0,"message":"success","data":' + b'{"k":"' + b"v" * 600 + b'"}}'


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.done = asyncio.Event()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if bytes(data).endswith(BODY):
            self.done.set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def serve(cls: type[HttpToolsProtocol], n: int) -> float:
    config = Config(app, http=cls, log_config=None, access_log=False, lifespan="off")
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    started = time.process_time()
    for _ in range(n):
        transport.done.clear()
        protocol.data_received(REQUEST)
        await transport.done.wait()
    elapsed = time.process_time() - started
    protocol.connection_lost(None)
    return elapsed / n


async def main_async(requests: int, rounds: int) -> None:
    bounded = bounded_http(ConnectionLimits(), 8192)
    await serve(HttpToolsProtocol, 2000)  # warm-up
    await serve(bounded, 2000)
    ratios, plain_us, bounded_us = [], [], []
    for i in range(rounds):
        # each round in the other order, each run after a collection: neither pays for the other's garbage
        times = {}
        for cls in (HttpToolsProtocol, bounded) if i % 2 else (bounded, HttpToolsProtocol):
            gc.collect()
            times[cls] = await serve(cls, requests)
        plain, limited = times[HttpToolsProtocol], times[bounded]
        plain_us.append(plain * 1e6)
        bounded_us.append(limited * 1e6)
        ratios.append(limited / plain)
    print(f"uvicorn HttpToolsProtocol    {statistics.median(plain_us):6.2f} us/request (median of {rounds})")
    print(f"BoundedHttpToolsProtocol     {statistics.median(bounded_us):6.2f} us/request")
    print(f"  bounded / plain {statistics.median(ratios):.3f} (median of per-round ratios; "
          f"range {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main_async(args.requests, args.rounds))


if __name__ == "__main__":
    main()
