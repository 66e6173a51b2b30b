"""The upstream client (gateway/http_client.py) against upstreams that misbehave on purpose.

The gateway's upstreams are backend services: buggy, slow, overloaded, or (rarely) hostile. Each
case here is a raw asyncio server whose bytes the test writes itself, driving the client directly;
the last cases run the whole gateway as a process with such a server as its upstream. A case the
client gets wrong is kept as a strict xfail whose reason says what happens: the lead sees it, and it
turns into a plain failure (to be unmarked) once the client is fixed.

Every case is bounded (LIMIT_SEC) and checks that the loop logged no "Task/Future exception was
never retrieved" or other error through its exception handler.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest

from gateway.http_client import HIGH_WATER, HttpClient
from gateway.upstream import Body, Timeouts, UpstreamError
from tests.conftest import DEMO_KEY, gateway_config
from tests.procs import Service, free_port, wait_until
from tests.test_upstream_client import (
    QUICK,
    Handler,
    RawServer,
    answer,
    client_of,
    on_both_loops,
    poll,
    read_request,
)

LIMIT_SEC = 10.0
SHORT = Timeouts(connect=1.0, read=0.5)
SECOND = answer(b"second")

Outcome = tuple[int, bytes] | str


@contextlib.asynccontextmanager
async def loop_errors_checked() -> AsyncIterator[None]:
    """Fails the test if anything reached the loop's exception handler (never-retrieved exceptions included)."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(str(context.get("message"))))
    try:
        yield
        gc.collect()  # a never-retrieved exception is reported when its task or future is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert not seen, seen


def attack(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A bounded case on uvloop and asyncio, checked for loop errors."""
    async def bounded() -> None:
        async with asyncio.timeout(LIMIT_SEC), loop_errors_checked():
            await test()

    bounded.__name__ = test.__name__
    return on_both_loops(bounded)


async def outcome(client: HttpClient, url: str, timeouts: Timeouts = QUICK, method: str = "GET",
                  body: Body = None) -> Outcome:
    """(status, whole body), or the UpstreamError's kind."""
    try:
        resp = await client.request(method, url, [], body, timeouts)
        return resp.status, await resp.read()
    except UpstreamError as exc:
        return exc.kind


def serving(first: bytes, rest: bytes = SECOND) -> Handler:
    """Answers the first request the server gets with `first`, every later one with `rest`, keeping connections."""
    served = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        while True:
            await read_request(reader)
            served += 1
            writer.write(first if served == 1 else rest)
            await writer.drain()

    return serve


def reset(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP RST (SO_LINGER 0), as a crashed or overloaded host's kernel does."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def full_backlog() -> Iterator[str]:
    """A URL whose listener never accepts and whose accept queue is full: a SYN there is dropped."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(address)
            fillers.append(filler)
        yield f"http://127.0.0.1:{address[1]}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


# response smuggling and desync


@attack
async def test_a_second_answer_in_the_same_packet_is_not_given_to_the_next_request() -> None:
    async with RawServer(serving(answer(b"first") + answer(b"SMUGGLED"))) as server, client_of(1) as client:
        assert await outcome(client, server.url) == (200, b"first")
        assert await outcome(client, server.url) == (200, b"second")
        assert await outcome(client, server.url) == (200, b"second")
    assert server.connections == 2


@attack
async def test_a_partial_answer_after_a_complete_one_is_not_given_to_the_next_request() -> None:
    leftover = b"HTTP/1.1 200 OK\r\nx-smuggled: 1\r\n"
    async with RawServer(serving(answer(b"first") + leftover)) as server, client_of(1) as client:
        assert await outcome(client, server.url) == (200, b"first")
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.header("x-smuggled") is None
        assert (resp.status, await resp.read()) == (200, b"second")


@attack
async def test_an_answer_on_an_idle_connection_closes_it() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:
            writer.write(answer(b"first"))
            await writer.drain()
            writer.write(answer(b"SMUGGLED"))  # nobody asked: arrives while the connection is idle in the pool
            await reader.read()
            return
        writer.write(SECOND)

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url) == (200, b"first")
        await poll(lambda: server.closed == 1, "the client to drop the connection that spoke unasked")
        assert await outcome(client, server.url) == (200, b"second")


@attack
async def test_content_length_with_transfer_encoding_is_refused_and_not_reused() -> None:
    both = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    async with RawServer(serving(both)) as server, client_of(1) as client:
        # chunked wins (RFC 9112 6.3) or the answer is refused; the length must never frame it
        assert await outcome(client, server.url) in ("reset", (200, b"hello"))
        assert await outcome(client, server.url) == (200, b"second")
    assert server.connections == 2


@attack
async def test_malformed_framing_and_heads_are_refused_never_guessed() -> None:
    heads = [
        b"x-a: b\r\n c\r\ncontent-length: 2",  # obs-fold
        b"content-length : 2",  # whitespace before the colon: a classic desync
        b"content-length: 2, 2", b"content-length: 2\r\ncontent-length: 3", b"content-length: -1",
        b"content-length: +2", b"content-length: 99999999999999999999999",
        b"x-a: b\x00c\r\ncontent-length: 2", b"x-a: b\rc\r\ncontent-length: 2",
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections <= len(heads):
            writer.write(b"HTTP/1.1 200 OK\r\n" + heads[server.connections - 1] + b"\r\n\r\nok")
        else:  # bare LF line ends
            writer.write(b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok")
        await reader.read()

    async with RawServer(serve) as server, client_of() as client:
        for _ in range(len(heads) + 1):
            assert await outcome(client, server.url) == "reset"


@attack
async def test_invalid_chunk_framing_is_an_error_and_the_connection_is_dropped() -> None:
    bad = [b"zz\r\nhello\r\n0\r\n\r\n", b"-5\r\nhello\r\n0\r\n\r\n", b"f" * 40 + b"\r\n",
           b"5\r\nhelloEXTRA\r\n0\r\n\r\n", b"5\r\nhello0\r\n\r\n"]
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        valid = b"5;ext=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n"
        body = bad[server.connections - 1] if server.connections <= len(bad) else valid
        while True:
            await read_request(reader)
            writer.write(head + body)
            await writer.drain()

    async with RawServer(serve) as server, client_of(1) as client:
        for _ in bad:
            assert await outcome(client, server.url) == "reset"
        # an extension and a trailer are valid: the same connection serves the next request
        assert await outcome(client, server.url) == (200, b"hello")
        assert await outcome(client, server.url) == (200, b"hello")
    assert server.connections == len(bad) + 1


@attack
async def test_chunked_answer_cut_short_is_an_error_streamed_and_whole() -> None:
    cuts = [b"5\r\nhello\r\n", b"5\r\nhel", b"5"]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + cuts[(server.connections - 1) % 3])

    async with RawServer(serve) as server, client_of() as client:
        for _ in cuts:
            assert await outcome(client, server.url) == "reset"
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.stream is not None
        got = b""
        with pytest.raises(UpstreamError) as cut:
            async for chunk in resp.stream:
                got += chunk
        assert cut.value.kind == "reset" and got == b"hello"


@attack
async def test_a_transfer_coding_other_than_chunked_is_refused() -> None:
    # the gateway decodes no other coding (as h11): forwarded, its raw bytes would pass for the body
    codings = [b"gzip", b"chunked, identity", b"x-custom", b"gzip, chunked", b"chunked, chunked"]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: %b\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                     % codings[server.connections - 1])

    async with RawServer(serve) as server, client_of() as client:
        for _ in codings:
            assert await outcome(client, server.url) == "reset"


@attack
async def test_a_body_on_head_204_and_304_is_not_read_as_the_next_answer() -> None:
    bodies = [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"HTTP/1.1 204 No Content\r\n\r\nhello",
              b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\nhello"]
    for first, method in zip(bodies, ("HEAD", "GET", "GET"), strict=True):
        async with RawServer(serving(first)) as server, client_of(1) as client:
            assert await outcome(client, server.url, method=method) == (int(first[9:12]), b"")
            assert await outcome(client, server.url) == (200, b"second")
            assert await outcome(client, server.url) == (200, b"second")


# interim answers


@attack
async def test_interim_answers_are_skipped_and_a_flood_of_them_is_cut_off() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" * 3

    served = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        while True:
            await read_request(reader)
            served += 1
            if served == 1:
                writer.write(interim + answer(b"final"))
                continue
            for _ in range(100_000):  # an endless stream of 100 Continue, bounded for the test's sake
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
                await writer.drain()

    async with RawServer(serve) as server, client_of() as client:
        resp = await client.request("POST", server.url, [], b"{}", QUICK)
        assert resp.status == 200 and resp.header("link") is None and await resp.read() == b"final"
        assert await outcome(client, server.url) == "reset"


@attack
async def test_an_unasked_switching_protocols_is_a_reset() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nraw")
        await reader.read()

    async with RawServer(serve) as server, client_of() as client:
        assert await outcome(client, server.url) == "reset"


# header floods


@attack
async def test_header_floods_fail_fast_within_the_head_limit() -> None:
    floods = [b"x-big: " + b"v" * (1 << 20), b"".join(b"x-h%d: v\r\n" % i for i in range(5000))]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        if server.connections <= len(floods):
            writer.write(floods[server.connections - 1] + b"\r\ncontent-length: 0\r\n\r\n")
            await reader.read()
            return
        for _ in range(1_000_000):  # a head that never ends (bounded for the test's sake)
            writer.write(b"x-more: v\r\n" * 1000)
            await writer.drain()

    async with RawServer(serve) as server, client_of() as client:
        for _ in range(len(floods) + 1):
            started = time.monotonic()
            assert await outcome(client, server.url) == "reset"
            assert time.monotonic() - started < 2.0
        await poll(lambda: server.closed == 3, "every flooding connection to be closed")


# bodies: endless, dripping, backpressure


@attack
async def test_an_endless_chunked_body_streams_in_bounded_pieces_and_release_frees_the_slot() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections > 1:
            writer.write(SECOND)
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(1_000_000):
            writer.write(b"4000\r\n" + b"e" * 0x4000 + b"\r\n")
            await writer.drain()

    async with RawServer(serve) as server, client_of(1) as client:
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.stream is not None
        received = 0
        async for chunk in resp.stream:
            assert len(chunk) <= 4 * HIGH_WATER
            received += len(chunk)
            if received > 8 * 1024 * 1024:
                break
        resp.close()
        await poll(lambda: server.closed == 1, "the endless answer's connection to close")
        assert await outcome(client, server.url) == (200, b"second")


@attack
async def test_a_body_in_tiny_chunks_read_whole_keeps_memory_near_its_size() -> None:
    size = 256 * 1024

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(size // 1024):
            writer.write(b"1\r\nj\r\n" * 1024)
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with RawServer(serve) as server, client_of() as client:
        tracemalloc.start()
        try:
            resp = await client.request("GET", server.url, [], None, QUICK)
            assert await resp.read() == b"j" * size
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 * size, f"{peak >> 10} KiB at the peak for a {size >> 10} KiB body"


@attack
async def test_a_dripping_chunked_body_is_read_and_a_stall_is_a_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(8):  # 0.8 s in all, each piece well within the 0.5 s read timeout
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nd\r\n")
        writer.write(b"0\r\n\r\n")
        await read_request(reader)  # the second request, on the same connection
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1\r\nd\r\n" * 8)
        await reader.read()  # then stalls

    async with RawServer(serve) as server, client_of() as client:
        assert await outcome(client, server.url, SHORT) == (200, b"d" * 8)
        resp = await client.request("GET", server.url, [], None, SHORT)
        assert resp.stream is not None
        got = b""
        with pytest.raises(UpstreamError) as stalled:
            async for chunk in resp.stream:
                got += chunk
        assert stalled.value.kind == "timeout" and got == b"d" * 8
        await poll(lambda: server.closed == 1, "the stalled connection to close")


# the peer's side of the connection


@attack
async def test_idle_connection_reset_by_the_peer_then_a_new_request_succeeds() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer())
        await writer.drain()
        if server.connections == 1:
            reset(writer)

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url) == (200, b"ok")
        await poll(lambda: server.closed == 1, "the server to reset its side")
        assert await outcome(client, server.url) == (200, b"ok")


@attack
async def test_reset_before_the_answer_is_retried_only_on_a_reused_connection() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:  # a fresh connection reset: the request may have been acted on
            reset(writer)
            return
        writer.write(answer())
        await writer.drain()
        if server.connections == 2:  # a reused one reset before any byte: sent again on a new one
            await read_request(reader)
            reset(writer)
            return
        while True:
            await read_request(reader)
            writer.write(answer())

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url) == "reset"
        assert server.connections == 1
        assert await outcome(client, server.url) == (200, b"ok")
        assert await outcome(client, server.url) == (200, b"ok")
        assert server.connections == 3


@attack
async def test_reset_mid_answer_is_a_reset() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc" if server.connections == 2 else b"HTTP/1.1 2")
        await writer.drain()
        reset(writer)

    async with RawServer(serve) as server, client_of() as client:
        assert await outcome(client, server.url) == "reset"
        assert await outcome(client, server.url) == "reset"


@attack
async def test_a_silent_peer_is_a_timeout_and_frees_the_slot() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:
            await reader.read()
            return
        writer.write(answer())

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url, SHORT) == "timeout"
        assert await outcome(client, server.url, SHORT) == (200, b"ok")


@attack
async def test_a_slow_streamed_upload_is_not_a_read_timeout() -> None:
    async def slow_body() -> AsyncIterator[bytes]:
        for _ in range(6):  # 1.2 s in all, a piece every 0.2 s: well within the 0.5 s read timeout
            await asyncio.sleep(0.2)
            yield b"x" * 100

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.readuntil(b"0\r\n\r\n")  # the upstream answers once the body is whole
        writer.write(answer())
        await reader.read()

    async with RawServer(serve) as server, client_of() as client:
        assert await outcome(client, server.url, SHORT, "POST", slow_body()) == (200, b"ok")


@attack
async def test_an_early_answer_stops_a_streamed_body_and_is_returned() -> None:
    yielded = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal yielded
        for _ in range(100_000):
            yielded += 1
            yield b"u" * 65536

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:  # 413 and close, draining politely so that the answer is not lost to a RST
            writer.write(b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 9\r\n\r\ntoo large")
            await writer.drain()
            writer.write_eof()
            while await reader.read(1 << 16):
                pass
            return
        if server.connections == 2:  # 200 kept alive before the body's end: the connection cannot serve another
            writer.write(answer(b"early"))
            while await reader.read(1 << 16):
                pass
            return
        writer.write(SECOND)

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url, method="POST", body=endless()) == (413, b"too large")
        assert await outcome(client, server.url, method="POST", body=endless()) == (200, b"early")
        await poll(lambda: server.closed == 2, "both connections to close")
        assert yielded < 1000
        assert await outcome(client, server.url) == (200, b"second")


@attack
async def test_an_early_answer_then_reset_is_the_answer_or_a_reset_never_a_hang() -> None:
    async def endless() -> AsyncIterator[bytes]:
        for _ in range(100_000):
            yield b"u" * 65536

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\n\r\ntoo large")
        await writer.drain()
        reset(writer)

    async with RawServer(serve) as server, client_of(1) as client:
        assert await outcome(client, server.url, method="POST", body=endless()) in ((413, b"too large"), "reset")
        assert await outcome(client, server.url, method="POST", body=b"x" * (4 << 20)) in ((413, b"too large"),
                                                                                         "reset")


# cancellation


@attack
async def test_cancelled_mid_head_and_mid_body_the_pool_serves_the_next_request_correctly() -> None:
    partial = {b"/head": b"HTTP/1.1 200 OK\r\nx-a: 1\r\n",
               b"/body": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"p" * 10}
    sent = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        while True:
            target = (await read_request(reader)).split(b" ")[1]
            if target in partial:  # then silence: the client is cancelled before the rest would come
                writer.write(partial[target])
                await writer.drain()
                sent += 1
                await reader.read()
                return
            writer.write(SECOND)

    async def read_whole(path: str) -> None:
        await outcome(client, server.url + path)

    async def read_streamed(path: str) -> None:  # drops the answer unreleased when cancelled
        resp = await client.request("GET", server.url + path, [], None, QUICK)
        assert resp.stream is not None
        async for _ in resp.stream:
            pass

    async with RawServer(serve) as server, client_of(1) as client:
        cases = [(read_whole, "/head"), (read_whole, "/body"), (read_streamed, "/body")]
        for i, (call, path) in enumerate(cases):
            def answered(n: int = i + 1) -> bool:
                return sent == n

            def dropped(n: int = i + 1) -> bool:
                return server.closed == n

            task = asyncio.create_task(call(path))
            await poll(answered, "the partial answer to be sent")
            await asyncio.sleep(0.05)  # not synchronisation: lets the client take the bytes in, or not
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            del task
            await poll(dropped, "the cancelled request's connection to close")
            assert await outcome(client, server.url) == (200, b"second")
    await poll(lambda: server.closed == server.connections, "every connection closed once the client is")


@attack
async def test_cancelled_while_waiting_for_a_slot_or_connecting_frees_the_slot() -> None:
    arrived: list[str] = []
    held = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(reader)
            arrived.append(head.split(b" ")[1].decode())
            if len(arrived) == 1:
                await held.wait()
            writer.write(answer())
            await writer.drain()

    async with RawServer(serve) as server, client_of(1) as client:
        first = asyncio.create_task(outcome(client, f"{server.url}/a"))
        await poll(lambda: len(arrived) == 1, "the first request to hold the only slot")
        waiting = []
        for name in ("b", "c", "d"):
            waiting.append(asyncio.create_task(outcome(client, f"{server.url}/{name}")))
            await asyncio.sleep(0)  # one turn: the task queues for the slot before the next is made
        waiting[1].cancel()
        held.set()
        assert await first == (200, b"ok")
        assert [await waiting[0], await waiting[2]] == [(200, b"ok")] * 2
        with pytest.raises(asyncio.CancelledError):
            await waiting[1]
        assert arrived == ["/a", "/b", "/d"]

    with full_backlog() as url:
        async with client_of(1) as client:
            connecting = asyncio.create_task(outcome(client, url))
            await asyncio.sleep(0.1)  # not synchronisation: the connect cannot finish, this only lets it start
            connecting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await connecting
            # the slot is free again: the next request waits for its own connect, which times out
            assert await outcome(client, url, Timeouts(connect=0.3, read=1.0)) == "timeout"


# the pool


@attack
async def test_pool_bound_under_concurrency_and_waiters_not_stranded_by_a_failing_connection() -> None:
    arrived: list[str] = []
    held = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await read_request(reader)
            target = head.split(b" ")[1].decode()
            arrived.append(target)
            await held.wait()
            if target == "/doomed":
                reset(writer)
                return
            writer.write(answer(target.encode()))
            await writer.drain()

    async with RawServer(serve) as server, client_of(3) as client:
        calls = [asyncio.create_task(outcome(client, f"{server.url}/{i}")) for i in range(12)]
        await poll(lambda: len(arrived) == 3, "three requests at the server")
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(arrived) == 3 and server.connections == 3
        held.set()
        assert await asyncio.gather(*calls) == [(200, f"/{i}".encode()) for i in range(12)]
        assert server.connections == 3

    arrived.clear()
    held.clear()
    async with RawServer(serve) as server, client_of(1) as client:
        doomed = asyncio.create_task(outcome(client, f"{server.url}/doomed"))
        await poll(lambda: len(arrived) == 1, "the doomed request to hold the only slot")
        queued = []
        for i in range(4):
            queued.append(asyncio.create_task(outcome(client, f"{server.url}/{i}")))
            await asyncio.sleep(0)  # one turn: the task queues for the slot before the next is made
        held.set()
        assert await doomed == "reset"
        assert await asyncio.gather(*queued) == [(200, f"/{i}".encode()) for i in range(4)]
        assert arrived == ["/doomed", "/0", "/1", "/2", "/3"]
    await poll(lambda: server.closed == server.connections, "every connection closed once the client is")


@attack
async def test_refused_connects_under_load_leak_no_slot_and_the_upstream_coming_back_is_used() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with client_of(2) as client:
        refused = await asyncio.gather(*[outcome(client, url) for _ in range(20)])
        assert refused == ["connect_error"] * 20
        ok = serving(answer(), answer())

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await ok(reader, writer)

        server = await asyncio.start_server(serve, "127.0.0.1", port)  # the upstream is back, on the same port
        try:
            assert await asyncio.gather(*[outcome(client, url) for _ in range(20)]) == [(200, b"ok")] * 20
        finally:
            server.close()


@attack
async def test_failures_are_classified_for_retry_and_breaker() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")  # at once: to a request, and to a TLS handshake
        await reader.read()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async with RawServer(garbage) as talker, RawServer(silent) as mute, client_of() as client:
        assert await outcome(client, talker.url) == "reset"
        assert await outcome(client, talker.url.replace("http:", "https:")) == "connect_error"  # no TLS there
        assert await outcome(client, mute.url.replace("http:", "https:"), SHORT) == "timeout"  # handshake unanswered
    with full_backlog() as url:
        async with client_of() as client:
            started = time.monotonic()
            assert await outcome(client, url, Timeouts(connect=0.3, read=5.0)) == "timeout"
            assert time.monotonic() - started < 1.5


# request header injection


@attack
async def test_control_characters_in_a_request_never_split_a_header() -> None:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            heads.append(await read_request(reader))
            writer.write(answer())

    refused: list[tuple[str, list[tuple[str, str]]]] = [
        ("GET", [("x-a", "b\nx-evil: 1")]), ("GET", [("x-a", "b\x0bc")]), ("GET", [("x-a", "b\x7f")]),
        ("GET", [("x-a", "b\u0100")]), ("GET", [("x-a", "b\u2028x-evil: 1")]), ("GET", [("", "v")]),
        ("GET", [("x a", "v")]), ("GET", [("x-a\r", "v")]), ("GET /x HTTP/1.1\r\nx-evil: 1\r\nx", []),
        ("GET\x00", []),
    ]
    async with RawServer(serve) as server, client_of() as client:
        for method, headers in refused:
            with pytest.raises(ValueError):
                await client.request(method, f"{server.url}/p", headers, None, QUICK)
        for target in ("/p?q=1\r\nx-evil:%201", "/p x HTTP/1.1\r\nx-evil: 1", "/p\x00\x85é€"):
            resp = await client.request("GET", f"{server.url}{target}", [("x-ok", "obs\x85text\tand tab")], None,
                                        QUICK)
            assert await resp.read() == b"ok"
    assert len(heads) == 3
    for head in heads:
        lines = head.split(b"\r\n")
        assert lines[0].count(b" ") == 2 and not any(line.lower().startswith(b"x-evil") for line in lines)
        assert b"\n" not in b"".join(lines) and b"\x00" not in head
        assert lines[2] == b"x-ok: obs\x85text\tand tab"


@attack
async def test_the_client_alone_frames_the_request() -> None:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            heads.append(await read_request(reader))
            await reader.readexactly(5)
            writer.write(answer())

    async with RawServer(serve) as server, client_of() as client:
        for name, value in (("transfer-encoding", "chunked"), ("content-length", "0"), ("host", "internal.admin")):
            try:
                resp = await client.request("POST", server.url, [(name, value)], b"hello", QUICK)
                await resp.read()
            except ValueError:
                continue  # refused: as good as sent once
            names = [line.split(b":")[0].lower() for line in heads[-1].split(b"\r\n")[1:] if line]
            framing = [n for n in names if n in (b"content-length", b"transfer-encoding")]
            assert names.count(b"host") == 1 and len(framing) == 1, heads[-1]


# the whole gateway with a misbehaving upstream


class ThreadedUpstream:
    """A raw upstream on a loop of its own, for a gateway process: each request is served by the handler
    registered for its path (`/raw/<name>` at the gateway, `/<name>` here)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.heads: list[bytes] = []
        self.sent: dict[str, int] = {}
        self.closed = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""
        self.server: asyncio.Server | None = None

    def __enter__(self) -> ThreadedUpstream:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", 0),
                                                       self.loop).result(5)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _stop(self) -> None:
        assert self.server is not None
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(reader)
                self.heads.append(head)
                await self.handlers[head.split(b" ")[1].decode()](reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed += 1


@pytest.fixture(scope="module")
def gateway_on_raw(module_services: Callable[..., Service],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, ThreadedUpstream]]:
    with ThreadedUpstream() as upstream:
        config = gateway_config(tmp_path_factory.mktemp("raw"), upstream.url)
        config["upstreams"]["raw"] = {"url": upstream.url, "pool_size": 4, "timeouts": {"connect": 1, "read": 2}}
        config["routes"].append({"name": "raw", "path": "/raw/{rest}", "methods": ["GET"], "upstream": "raw",
                                 "rewrite": "/{rest}", "plugins": ["auth"]})
        config["routes"].append({"name": "raw-timed", "path": "/timed/{rest}", "methods": ["GET"], "upstream": "raw",
                                 "rewrite": "/{rest}",
                                 "plugins": ["auth"], "policy": {"timeout": {"connect": 1, "read": 2, "total": 1}}})
        yield module_services("gateway", config, name="gateway-raw"), upstream


AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}


def big_download(upstream: ThreadedUpstream, name: str, total: int) -> Handler:
    """Serves `total` bytes at /`name`, counting in upstream.sent[name] what the gateway took."""
    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"z" * (1 << 20)
        while upstream.sent[name] < total:
            writer.write(block)
            await writer.drain()
            upstream.sent[name] += len(block)

    upstream.sent[name] = 0
    upstream.handlers[f"/{name}"] = big
    return big


def start_download(gateway: Service, path: str) -> socket.socket:
    """A client that sends the request, reads the status line, then reads no more."""
    slow = socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1])), timeout=5)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    slow.sendall(b"GET %b HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %b\r\n\r\n"
                 % (path.encode(), DEMO_KEY.encode()))
    assert slow.recv(65536).startswith(b"HTTP/1.1 200")
    return slow


def test_gateway_streams_a_download_with_backpressure_and_cuts_a_short_body(
        gateway_on_raw: tuple[Service, ThreadedUpstream]) -> None:
    gateway, upstream = gateway_on_raw
    big_download(upstream, "big", 256 << 20)

    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"s" * 10)
        await writer.drain()
        writer.close()

    upstream.handlers["/short"] = short
    rss_before = gateway.rss_bytes()
    with start_download(gateway, "/raw/big"):
        # the client reads no more: the upstream must be held back, the gateway's memory flat
        last = -1
        deadline = time.monotonic() + 10
        while last != upstream.sent["big"] and time.monotonic() < deadline:
            last = upstream.sent["big"]
            time.sleep(0.3)
        assert last < 64 << 20, f"the upstream pushed {last >> 20} MiB past a stalled client"
        assert gateway.rss_bytes() - rss_before < 48 << 20
    with httpx.Client(timeout=5) as client, pytest.raises(httpx.RemoteProtocolError):
        client.get(f"{gateway.url}/raw/short", headers=AUTH)


def test_gateway_drops_the_upstream_of_a_client_that_left_mid_download(
        gateway_on_raw: tuple[Service, ThreadedUpstream]) -> None:
    gateway, upstream = gateway_on_raw
    total = 256 << 20
    big_download(upstream, "gone", total)
    closed_before = upstream.closed
    start_download(gateway, "/raw/gone").close()
    wait_until(lambda: upstream.closed > closed_before or upstream.sent["gone"] >= total, 20,
               what="the upstream connection to be dropped or drained")
    assert upstream.sent["gone"] < total, f"the gateway read {upstream.sent['gone'] >> 20} MiB for a client that left"


@pytest.mark.parametrize("raw_header", [b"x-a: b\x00c", b"x-a: b\rx-evil: 1", b"x-a: b\r\n x-evil: 1",
                                        b"x-a\r\nx-evil: 1"],
                         ids=["nul", "bare-cr", "obs-fold", "split-name"])
def test_gateway_never_sends_a_split_header_upstream(gateway_on_raw: tuple[Service, ThreadedUpstream],
                                                     raw_header: bytes) -> None:
    gateway, upstream = gateway_on_raw

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer())

    upstream.handlers["/inj"] = ok
    upstream.heads.clear()
    port = int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /raw/inj HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %b\r\n%b\r\nconnection: close\r\n\r\n"
                     % (DEMO_KEY.encode(), raw_header))
        status = sock.recv(65536).split(b" ", 2)[1]
    assert all(b"x-evil" not in head.lower() for head in upstream.heads)
    assert status in (b"200", b"400"), f"bad input answered {status!r}"


@pytest.mark.parametrize("answer_bytes", [
    b"SSH-2.0-OpenSSH_9.6\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\nok",
    b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
], ids=["garbage", "length-and-chunked", "switching-protocols"])
def test_gateway_answers_a_broken_upstream_with_a_502_envelope(gateway_on_raw: tuple[Service, ThreadedUpstream],
                                                               answer_bytes: bytes) -> None:
    gateway, upstream = gateway_on_raw

    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer_bytes)
        await writer.drain()
        writer.close()

    upstream.handlers["/broken"] = broken
    with httpx.Client(timeout=5) as client:
        resp = client.get(f"{gateway.url}/raw/broken", headers=AUTH)
    assert resp.status_code == 502 and resp.json()["code"] != 0, (resp.status_code, resp.text[:200])


def test_gateway_cuts_a_dripping_head_at_the_routes_total_time(
        gateway_on_raw: tuple[Service, ThreadedUpstream]) -> None:
    gateway, upstream = gateway_on_raw

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(50):  # a header line every 0.2 s: the per-read timeout (2 s) never fires
            await asyncio.sleep(0.2)
            writer.write(b"x-drip: 1\r\n")
            await writer.drain()

    upstream.handlers["/drip"] = drip
    closed_before = upstream.closed
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        resp = client.get(f"{gateway.url}/timed/drip", headers=AUTH)
    assert resp.status_code == 504 and time.monotonic() - started < 4, (resp.status_code, resp.text[:200])
    wait_until(lambda: upstream.closed > closed_before, 5, what="the gateway to close the dripping connection")
