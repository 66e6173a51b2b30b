"""The gateway's upstream client (gateway/http_client.py) against real servers on real sockets.

uvicorn serves the ordinary answers; a raw asyncio server, whose bytes each test writes
itself, serves the odd ones (cut short, silent, closing, oversized). Each test runs on
uvloop (the gateway's loop) and on asyncio's own.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.http_client import HIGH_WATER, HttpClient
from gateway.upstream import Timeouts, UpstreamError
from tests.procs import free_port

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

QUICK = Timeouts(connect=2.0, read=5.0)
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def on_both_loops(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[LoopFactory], None]:
    @pytest.mark.parametrize("loop_factory", [uvloop.new_event_loop, asyncio.new_event_loop],
                             ids=["uvloop", "asyncio"])
    def run(loop_factory: LoopFactory) -> None:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(test())

    run.__name__ = test.__name__
    return run


async def poll(check: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class InFlight:
    """How many requests the app serves at once, and the most it ever did."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.release = asyncio.Event()


def starlette_app(in_flight: InFlight) -> Starlette:
    async def peer(request: Request) -> JSONResponse:
        assert request.client is not None
        return JSONResponse({"port": request.client.port, "headers": dict(request.headers)})

    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse({"bytes": len(body), "body": body.decode(), "headers": dict(request.headers)})

    async def held(request: Request) -> JSONResponse:
        in_flight.now += 1
        in_flight.most = max(in_flight.most, in_flight.now)
        await in_flight.release.wait()
        in_flight.now -= 1
        assert request.client is not None
        return JSONResponse({"port": request.client.port})

    async def chunked(request: Request) -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            for i in range(50):
                yield f"part {i};".encode()
        return StreamingResponse(parts(), media_type="text/plain")

    async def sized(request: Request) -> Response:
        return Response(b"x" * 1000, media_type="text/plain")

    async def empty(request: Request) -> Response:
        return Response(status_code=204)

    return Starlette(routes=[
        Route("/peer", peer), Route("/echo", echo, methods=["POST", "PUT"]), Route("/held", held),
        Route("/chunked", chunked), Route("/sized", sized, methods=["GET", "HEAD"]), Route("/empty", empty),
    ])


@contextlib.asynccontextmanager
async def uvicorn_server(in_flight: InFlight | None = None) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(starlette_app(in_flight or InFlight()), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off", http="httptools",
                                           timeout_keep_alive=30))
    task = asyncio.create_task(server.serve())
    await poll(lambda: server.started, "uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An asyncio server whose answers a test writes byte by byte; it counts connections."""

    def __init__(self, handle: Handler) -> None:
        self.handle = handle
        self.connections = 0
        self.closed = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed += 1


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head (its body, if any, is left unread)."""
    return await reader.readuntil(b"\r\n\r\n")


def answer(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%b\r\n%b" % (len(body), extra, body)


async def get(client: HttpClient, url: str, timeouts: Timeouts = QUICK, method: str = "GET") -> tuple[int, bytes]:
    resp = await client.request(method, url, [("accept", "*/*")], None, timeouts)
    return resp.status, await resp.read()


@contextlib.asynccontextmanager
async def client_of(pool_size: int = 10) -> AsyncIterator[HttpClient]:
    client = HttpClient(pool_size)
    try:
        yield client
    finally:
        await client.close()


@on_both_loops
async def test_sequential_calls_share_one_kept_alive_connection() -> None:
    async with uvicorn_server() as url, client_of() as client:
        ports = set()
        for _ in range(5):
            resp = await client.request("GET", f"{url}/peer?x=1", [("x-tenant-id", "t1")], None, QUICK)
            assert resp.status == 200 and ("content-type", "application/json") in resp.headers
            data = await resp.json()
            ports.add(data["port"])
            assert data["headers"]["x-tenant-id"] == "t1" and data["headers"]["host"] == url.split("//")[1]
    assert len(ports) == 1


@on_both_loops
async def test_pool_bound_holds_requests_until_a_connection_is_free() -> None:
    in_flight = InFlight()
    async with uvicorn_server(in_flight) as url, client_of(pool_size=2) as client:
        calls = [asyncio.create_task(get(client, f"{url}/held")) for _ in range(6)]
        await poll(lambda: in_flight.now == 2, "two requests at the server")
        for _ in range(3):  # a few turns of the loop: nothing more may arrive while both are held
            await asyncio.sleep(0)
        assert in_flight.now == 2
        in_flight.release.set()
        results = await asyncio.gather(*calls)
    assert [status for status, _ in results] == [200] * 6
    assert in_flight.most == 2


@on_both_loops
async def test_an_origin_with_its_own_pool_size_is_bounded_by_it() -> None:
    in_flight = InFlight()
    async with uvicorn_server(in_flight) as url:
        client = HttpClient(1, pool_sizes={url: 3})
        try:
            calls = [asyncio.create_task(get(client, f"{url}/held")) for _ in range(6)]
            await poll(lambda: in_flight.now == 3, "three requests at the server")
            for _ in range(3):  # a few turns of the loop: nothing more may arrive while they are held
                await asyncio.sleep(0)
            in_flight.release.set()
            results = await asyncio.gather(*calls)
        finally:
            await client.close()
    assert [status for status, _ in results] == [200] * 6
    assert in_flight.most == 3


@on_both_loops
async def test_chunked_answer_whole_and_streamed() -> None:
    expected = b"".join(f"part {i};".encode() for i in range(50))
    async with uvicorn_server() as url, client_of() as client:
        assert await get(client, f"{url}/chunked") == (200, expected)
        resp = await client.request("GET", f"{url}/chunked", [], None, QUICK)
        assert resp.header("transfer-encoding") == "chunked" and resp.stream is not None
        assert b"".join([chunk async for chunk in resp.stream]) == expected
        resp.close()
        assert await get(client, f"{url}/chunked") == (200, expected)


@on_both_loops
async def test_head_and_204_have_no_body_and_the_connection_is_reused() -> None:
    async with uvicorn_server() as url, client_of() as client:
        resp = await client.request("HEAD", f"{url}/sized", [], None, QUICK)
        assert resp.status == 200 and resp.header("content-length") == "1000"
        assert await resp.read() == b""
        assert await get(client, f"{url}/empty") == (204, b"")
        assert await get(client, f"{url}/sized") == (200, b"x" * 1000)
        ports = {(await (await client.request("GET", f"{url}/peer", [], None, QUICK)).json())["port"]
                 for _ in range(2)}
    assert len(ports) == 1


@on_both_loops
async def test_request_bodies_bytes_and_streamed() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for piece in (b"one,", b"", b"two,", b"three"):
            yield piece

    async with uvicorn_server() as url, client_of() as client:
        sent = await client.request("POST", f"{url}/echo", [("content-type", "text/plain")], b"hello", QUICK)
        data = (await sent.json())
        assert data["bytes"] == 5 and data["headers"]["content-length"] == "5"
        streamed = await (await client.request("PUT", f"{url}/echo", [], parts(), QUICK)).json()
        assert streamed["body"] == "one,two,three" and streamed["headers"]["transfer-encoding"] == "chunked"
        empty = await (await client.request("POST", f"{url}/echo", [], None, QUICK)).json()
        assert empty["bytes"] == 0 and empty["headers"]["content-length"] == "0"


@on_both_loops
async def test_a_failing_body_stream_fails_the_request_with_its_own_error() -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"some"
        raise OverflowError("too large")

    async with uvicorn_server() as url, client_of() as client:
        with pytest.raises(OverflowError):
            await client.request("POST", f"{url}/echo", [], parts(), QUICK)
        assert (await get(client, f"{url}/peer"))[0] == 200


@on_both_loops
async def test_header_injection_is_refused() -> None:
    async with uvicorn_server() as url, client_of() as client:
        for headers in ([("x-a", "b\r\nx-evil: 1")], [("x-a\nx-evil", "1")], [("x-a", "b\x00")],
                        [("x-a: evil", "1")], [("x-a", "b\rc")]):
            with pytest.raises(ValueError):
                await client.request("GET", f"{url}/peer", headers, None, QUICK)
        # a path with a space or CR LF is percent-encoded: it cannot split the request line
        status, _ = await get(client, f"{url}/peer x\r\nx-evil: 1")
        assert status == 404


@on_both_loops
async def test_large_body_streams_with_backpressure() -> None:
    total = 64 * 1024 * 1024
    sent = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"z" * (1024 * 1024)
        while sent < total:
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async with RawServer(serve) as server, client_of() as client:
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.stream is not None
        first = await anext(resp.stream)
        # the reader is slow: the server must stall, held back by TCP once the client stops reading
        last = -1
        while last != sent:
            last = sent
            await asyncio.sleep(0.2)
        assert sent < total / 2, f"the server pushed {sent} bytes to a reader that took {len(first)}"
        received, biggest = len(first), len(first)
        async for chunk in resp.stream:
            received += len(chunk)
            biggest = max(biggest, len(chunk))
        assert received == total
        assert biggest <= 4 * HIGH_WATER


@on_both_loops
async def test_answer_cut_short_is_an_error_on_read() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"a" * 10)
        await writer.drain()

    async with RawServer(serve) as server, client_of() as client:
        resp = await client.request("GET", server.url, [], None, QUICK)
        with pytest.raises(UpstreamError) as whole:
            await resp.read()
        assert whole.value.kind == "reset"
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.stream is not None
        with pytest.raises(UpstreamError) as streamed:
            async for _ in resp.stream:
                pass
        assert streamed.value.kind == "reset"


@on_both_loops
async def test_body_framed_by_the_connection_end_is_whole_at_eof() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")

    async with RawServer(serve) as server, client_of() as client:
        assert await get(client, server.url) == (200, b"until the end")
        assert await get(client, server.url) == (200, b"until the end")
    assert server.connections == 2


@on_both_loops
async def test_connection_refused_is_connect_error() -> None:
    async with client_of() as client:
        with pytest.raises(UpstreamError) as refused:
            await get(client, f"http://127.0.0.1:{free_port()}/x")
    assert refused.value.kind == "connect_error"


@on_both_loops
async def test_silent_peer_is_a_timeout_and_a_slow_drip_is_not() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client gives up and closes

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n")
        for byte in b"drip-fed":
            await asyncio.sleep(0.1)  # each arrival within the read timeout, all of them well beyond it
            writer.write(bytes([byte]))

    short = Timeouts(connect=2.0, read=0.3)
    async with RawServer(silent) as quiet, RawServer(drip) as slow, client_of() as client:
        with pytest.raises(UpstreamError) as timed_out:
            await get(client, quiet.url, short)
        assert timed_out.value.kind == "timeout"
        await poll(lambda: quiet.closed == 1, "the timed-out connection to close")
        assert await get(client, slow.url, short) == (200, b"drip-fed")


@on_both_loops
async def test_deadline_bounds_a_slow_drip_and_a_wait_for_the_pool() -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\n":
            await asyncio.sleep(0.1)  # each arrival within the read timeout, the head never whole by the deadline
            writer.write(bytes([byte]))

    loop = asyncio.get_running_loop()
    async with RawServer(drip) as slow, client_of(pool_size=1) as client:
        first = asyncio.create_task(get(client, slow.url, Timeouts(read=0.3, deadline=loop.time() + 0.6)))
        await poll(lambda: slow.connections == 1, "the first request to arrive")
        with pytest.raises(UpstreamError) as waited:  # the only connection is taken: it waits for the pool
            await get(client, slow.url, Timeouts(read=5, deadline=loop.time() + 0.2))
        assert waited.value.kind == "timeout"
        with pytest.raises(UpstreamError) as dripped:
            await first
        assert dripped.value.kind == "timeout" and "total time" in str(dripped.value)


@on_both_loops
async def test_connection_close_and_http_1_0_are_not_reused() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(extra=b"connection: close\r\n"))
        await read_request(reader)  # a client that reused the connection would be answered nothing

    async def old(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await read_request(reader)

    async with RawServer(serve) as closing, RawServer(old) as http10, client_of() as client:
        for server in (closing, http10):
            assert await get(client, server.url) == (200, b"ok")
            assert await get(client, server.url) == (200, b"ok")
            assert server.connections == 2


@on_both_loops
async def test_released_unread_answer_closes_its_connection() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"b" * 10)

    async with RawServer(serve) as server, client_of() as client:
        resp = await client.request("GET", server.url, [], None, QUICK)
        resp.close()
        await poll(lambda: server.closed == 1, "the unread answer's connection to close")
        resp = await client.request("GET", server.url, [], None, QUICK)
        del resp  # dropped without release: the connection is closed, its slot freed
        await poll(lambda: server.closed == 2, "the dropped answer's connection to close")


@on_both_loops
async def test_idle_connection_closed_by_the_peer_then_a_new_request_succeeds() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer())
        await writer.drain()  # then closed, as an upstream's keep-alive timeout would

    async with RawServer(serve) as server, client_of(pool_size=1) as client:
        assert await get(client, server.url) == (200, b"ok")
        await poll(lambda: server.closed == 1, "the server to close its side")
        assert await get(client, server.url) == (200, b"ok")
    assert server.connections == 2


@on_both_loops
async def test_reused_connection_closed_before_answering_is_retried_only_when_safe() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer())
        await read_request(reader)  # the second request on this connection: closed unanswered

    async with RawServer(serve) as server, client_of(pool_size=1) as client:
        assert await get(client, server.url) == (200, b"ok")
        assert await get(client, server.url) == (200, b"ok")  # sent again, on a new connection
        assert server.connections == 2
        with pytest.raises(UpstreamError) as post:
            await client.request("POST", server.url, [], b"{}", QUICK)
        assert post.value.kind == "reset" and server.connections == 2


@on_both_loops
async def test_cancelled_request_closes_its_connection_and_frees_its_slot() -> None:
    answered = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        if answered == 0:
            answered += 1
            await read_request(reader)
            await reader.read()
            return
        await read_request(reader)
        writer.write(answer())

    async with RawServer(serve) as server, client_of(pool_size=1) as client:
        call = asyncio.create_task(get(client, server.url))
        await poll(lambda: server.connections == 1, "the request to arrive")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await poll(lambda: server.closed == 1, "the cancelled request's connection to close")
        assert await get(client, server.url) == (200, b"ok")


@on_both_loops
async def test_a_cancel_landing_after_the_answer_leaves_the_pooled_connection_open() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer())

    async with RawServer(serve) as server, client_of(pool_size=1) as client:
        assert await get(client, server.url) == (200, b"ok")
        pool = next(iter(client._pools.values()))
        give_back = pool.give_back

        def back_then_cancel(conn: Any) -> None:
            # the answer is whole and its connection pooled (maybe lent again), the caller not yet resumed
            give_back(conn)
            call.cancel()

        pool.give_back = back_then_cancel  # type: ignore[method-assign]
        call = asyncio.create_task(client.request("GET", server.url, [], None, QUICK))
        with pytest.raises(asyncio.CancelledError):
            await call
        pool.give_back = give_back  # type: ignore[method-assign]
        assert await get(client, server.url) == (200, b"ok")
    assert server.connections == 1


@on_both_loops
async def test_interim_answer_is_skipped_and_headers_are_lowercase() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + answer(extra=b"X-Mixed-Case: Value\r\n"))

    async with RawServer(serve) as server, client_of() as client:
        resp = await client.request("GET", server.url, [], None, QUICK)
        assert resp.status == 200 and ("x-mixed-case", "Value") in resp.headers and resp.header("link") is None
        assert await resp.read() == b"ok"


@on_both_loops
async def test_oversized_answer_head_is_a_reset() -> None:
    heads = [b"".join(b"x-h%d: v\r\n" % i for i in range(300)), b"x-big: " + b"v" * 70_000 + b"\r\n"]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + heads.pop() + b"content-length: 0\r\n\r\n")
        await reader.read()

    async with RawServer(serve) as server, client_of() as client:
        for _ in range(len(heads)):
            with pytest.raises(UpstreamError) as refused:
                await get(client, server.url)
            assert refused.value.kind == "reset"


def tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signs for `localhost`: (ca.pem, cert.pem, key.pem).

    cryptography is there through moto[server], a test dependency.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
                    ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
                critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(certificate("test CA", ca_key, "test CA", ca_key, True).public_bytes(
        serialization.Encoding.PEM))
    paths[1].write_bytes(certificate("localhost", key, "test CA", ca_key, False).public_bytes(
        serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.mark.parametrize("loop_factory", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])
def test_https_verifies_with_the_default_context_and_sends_sni(
        loop_factory: LoopFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca, cert, key = tls_files(tmp_path)
    server_names: list[str | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"secret"))
        await writer.drain()

    async def scenario() -> None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(cert, key)
        tls.sni_callback = lambda sock, name, ctx: server_names.append(name)
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        url = f"https://localhost:{server.sockets[0].getsockname()[1]}/x"
        try:
            async with client_of() as untrusting:  # the test CA is not among the system's
                with pytest.raises(UpstreamError) as refused:
                    await get(untrusting, url)
                assert refused.value.kind == "connect_error" and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
            monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # read when the default context is made
            async with client_of() as trusting:
                assert await get(trusting, url) == (200, b"secret")
        finally:
            server.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(scenario())
    assert server_names and set(server_names) == {"localhost"}
