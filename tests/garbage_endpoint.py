"""A slow endpoint that answers what no HTTP server should, on raw sockets (nothing tidies its answers), for the
attacks on `source: {kind: http}`. Run as `python -m tests.garbage_endpoint PORT`. By the request's path:
- /not_http: a line of another protocol, then the close;
- /header_flood: a 200 with 10,000 headers of 8,000 bytes each;
- /short: a 200 announcing 1,000,000 bytes, then 10 and the close;
- /bad_chunks: a chunked 200 whose chunk sizes are not hexadecimal;
- /healthz: 200.
Each connection is answered once and closed.
"""
from __future__ import annotations

import asyncio
import sys

HEADER = b"x-pad: " + b"a" * 8000 + b"\r\n"


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].split(b"?", 1)[0]
        if path == b"/not_http":
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        elif path == b"/header_flood":
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(10_000):
                writer.write(HEADER)
                await writer.drain()
            writer.write(b"\r\n")
        elif path == b"/short":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/csv\r\ncontent-length: 1000000\r\n\r\n0123456789")
        elif path == b"/bad_chunks":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
