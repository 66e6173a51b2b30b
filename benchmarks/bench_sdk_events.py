"""The SDK's event-stream reader against httpx-sse, before a hostile server: the client's peak memory.

A server on loopback answers `text/event-stream` with one `data:` line that never ends
(`--megabytes` of it, then it closes), or with one event of many short `data:` lines that
never dispatches. Each client runs in a process of its own, reads the stream through httpx
with one reader, and prints its peak RSS (`ru_maxrss`) and what stopped it:

- sdk:       exports_client.sse (LineSplitter + EventParser), as the SDK's `wait_events` reads;
- httpx-sse: httpx_sse.EventSource(response).aiter_sse(), its maintained equivalent.

The figure is memory, the one a stream a client keeps open is judged on; a well-behaved
stream costs both the same.

Run: python -m benchmarks.bench_sdk_events [--megabytes 256]   (httpx-sse: the `.[bench]` extra)
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import subprocess
import sys
from contextlib import closing

LINE_CHUNK = b"x" * 65536
EVENT_CHUNK = (b"data: " + b"x" * 250 + b"\n") * 256  # many short data lines, never a blank one


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _serve(port: int, shape: str, megabytes: int, served: asyncio.Event) -> None:
    """Answers every connection with the hostile stream, then closes it."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(b"data: " if shape == "line" else b"")
        chunk = LINE_CHUNK if shape == "line" else EVENT_CHUNK
        for _ in range(megabytes * 1024 * 1024 // len(chunk)):
            writer.write(chunk)
            try:
                await writer.drain()
            except ConnectionError:  # the client gave up, as a bounded reader does
                break
        writer.close()
        served.set()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await served.wait()


CLIENT = r"""
import asyncio, resource, sys
import httpx

async def main(url, reader):
    stopped = "stream ended"
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("GET", url) as resp:
            try:
                if reader == "sdk":
                    from exports_client import sse
                    splitter, parser = sse.LineSplitter(), sse.EventParser()
                    async for chunk in resp.aiter_bytes():
                        for line in splitter.feed(chunk):
                            parser.feed(line)
                else:
                    from httpx_sse import EventSource
                    async for _ in EventSource(resp).aiter_sse():
                        pass
            except Exception as exc:
                stopped = type(exc).__name__ + ": " + str(exc)[:80]
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, stopped)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _client(url: str, reader: str) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", CLIENT, url, reader], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split(maxsplit=1)
    return int(out[0]) / 1024, out[1].strip()


async def _measure(shape: str, reader: str, megabytes: int) -> tuple[float, str]:
    port, served = _free_port(), asyncio.Event()
    server = asyncio.create_task(_serve(port, shape, megabytes, served))
    try:
        return await asyncio.to_thread(_client, f"http://127.0.0.1:{port}/events", reader)
    finally:
        served.set()
        await server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=256, help="how much the hostile server sends")
    args = parser.parse_args()
    print(f"a hostile event stream of {args.megabytes} MiB; the client's peak RSS (MiB) and what stopped it")
    for shape, label in (("line", "one line that never ends"), ("event", "one event that never dispatches")):
        for reader in ("sdk", "httpx-sse"):
            rss, stopped = asyncio.run(_measure(shape, reader, args.megabytes))
            print(f"  {label:<34}{reader:<11}{rss:8.1f} MiB   {stopped}")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
