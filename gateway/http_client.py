"""The gateway's upstream HTTP/1.1 client: a keep-alive pool per origin on asyncio Protocols and llhttp.

Written here rather than taken from aiohttp because the proxied call is the gateway's hot
path and aiohttp's session spent ~296,000 CPU instructions on one pooled GET, the
whole gateway's list call ~960,000 (callgrind, docs/libraries.md "Libraries, and what is written
by hand"). Parsing is httptools (llhttp, Node's parser); what is written here is the
pooling, the framing of requests, and the timeouts.

- Pool: per origin, at most its pool size (its upstream's `pool_size`) connections lent at
  once (a request waits for a free one, FIFO); idle connections are reused newest first, dropped when the peer closes
  them or after `idle_timeout` seconds. A connection goes back to the pool only after a
  complete response with keep-alive to a completely sent request; anything else closes it.
- Timeouts: `connect` bounds opening the connection (TLS included); `read` bounds each
  wait for data (the time between arrivals, as aiohttp's sock_read); `deadline` bounds the
  wait for a pool slot and for the answer's head. Read timeouts and deadlines are checked
  on a tick of TICK_SEC. Cancelling a request, or releasing a response before its end,
  closes its connection.
- Failures leave as UpstreamError: connect_error (no connection could be opened), timeout
  (connect or read), reset (anything after connecting: closed early, unparsable answer).
  A body cut short raises on read, never ends cleanly: the gateway then cuts its client off.
- A kept-alive connection that the peer closed just before our request arrived is a race
  every HTTP/1.1 client meets. The request is sent once more, on a new connection, only when
  the server cannot have acted on it: the connection was reused, not one byte of an answer
  came back, the method is idempotent (RFC 9110 9.2.2) and the body is bytes we still hold,
  not a stream already consumed. aiohttp retries in the same case.
"""
from __future__ import annotations

import asyncio
import collections
import re
import ssl
from collections.abc import AsyncIterable
from typing import cast
from urllib.parse import quote, urlsplit

import httptools

from gateway.response import GatewayResponse
from gateway.upstream import AnswerTooLarge, Body, Timeouts, UpstreamError

# reading pauses once this much body is buffered unread, and resumes when the reader takes it
HIGH_WATER = 256 * 1024
# an answer's status line and headers, together; aiohttp allowed ~8 KiB per line
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256
IDLE_TIMEOUT_SEC = 30.0
# read timeouts and deadlines are checked this often, by one timer per pool for every waiting reader: a timer of
# its own per wait cost ~2,800 more instructions per call (callgrind); a timeout fires up to this much late
TICK_SEC = 0.05
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# methods that send no `content-length: 0` when they have no body (as aiohttp)
NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "CONNECT"})
BODY_WRITE_AT_ONCE = 64 * 1024
# body pieces smaller than this are gathered into one buffer as they arrive
SMALL_PIECE = 4 * 1024

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/?#]*)([^#]*)")
_VISIBLE = re.compile(r"[!-~]+")
_TOKEN_CHAR = r"[-!#$%&'*+.^_`|~0-9A-Za-z]"
_TOKEN = _TOKEN_CHAR + "+"
_METHOD = re.compile(_TOKEN)
# a header name the caller may give: the names that frame or route the request are the client's alone. Only a
# name starting with h, c or t pays for the look-ahead (a look-ahead on every name cost ~500 instructions each)
_NAME = (r"(?:[-!#$%&'*+.^_`|~0-9ABD-GI-SU-Zabd-gi-su-z]" + _TOKEN_CHAR + "*"
         r"|(?!(?i:host|content[-_]length|transfer[-_]encoding)\x00)" + _TOKEN + ")")
# headers joined as name NUL value SOH ...: names are tokens, values hold no control byte but tab (so no
# CR, LF or NUL), and the markers, being controls, can only stand where they were put. A caller's second host,
# or a length next to a chunked coding, would be read one way here and another by a lenient server (headers.py
# drops them before; this is the last line)
_FIELDS = re.compile(r"(?:" + _NAME + r"\x00[\t -~\x80-\xff]*\x01)*")
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"


class _StaleConnection(UpstreamError):
    """A reused connection ended before any byte of the answer: the request may be sent again."""


class _Reply:
    """One response as it arrives: what the connection fills in and the reader takes out."""

    __slots__ = ("chunks", "done", "error", "head_done", "head_only", "headers", "limit", "size", "status",
                 "unbounded", "waiter")

    def __init__(self, head_only: bool) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes | bytearray] = []
        self.size = 0
        self.head_done = False
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.head_only = head_only
        # `whole` reads everything: no pause on the way, but no more than `limit` bytes
        self.unbounded = False
        self.limit = 0

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One kept-alive connection; the parser's callbacks land here and fill the current reply."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.stale_parser = False
        self.reply: _Reply | None = None
        self.raw_headers: list[tuple[bytes, bytes]] = []
        # bytes received before the head was whole, and the size of the headers parsed
        self.head_bytes = 0
        self.head_size = 0
        self.interim = False
        # holds one of its pool's slots: from lease until back in the idle list or closed
        self.leased = False
        self.reused = False
        self.closed = False
        self.request_sent = False
        self.reading_paused = False
        self.write_waiter: asyncio.Future[None] | None = None
        self.writer: asyncio.Task[None] | None = None
        # while a reader waits: when data last came, and the bounds the pool's tick checks
        self.last_data = 0.0
        self.read_timeout = 0.0
        self.deadline: float | None = None
        self.idle_since = 0.0

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        reply = self.reply
        if reply is None:  # an answer nobody asked for: the connection's framing cannot be trusted
            self.close()
            return
        if reply.waiter is not None:  # the read timeout counts from the last arrival
            self.last_data = self.loop.time()
        head_done = reply.head_done
        if not head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            cause = exc.__cause__ or exc.__context__
            self._fail(cause if isinstance(cause, UpstreamError) else
                       UpstreamError("reset", f"unparsable answer: {exc}"))
            return
        # the parser holds a head until it is whole: a peer that never ends one is cut off here
        if not head_done and not reply.head_done and self.head_bytes > MAX_HEAD_BYTES:
            self._fail(UpstreamError("reset", f"the upstream's headers passed {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        reply = self.reply
        if reply is not None and not reply.done:
            if reply.head_done and reply.error is None and self._ends_at_close(reply):
                self._complete(reply, reuse=False)
            elif not reply.head_done and self.head_bytes == 0 and self.reused:
                self._fail(_StaleConnection("reset", "a kept-alive connection was closed by the upstream"))
            else:
                self._fail(UpstreamError("reset", f"the upstream closed the connection mid-answer: {exc or 'EOF'}"))
        self.closed = True
        self._wake_writer()
        self.pool.dropped(self)

    def pause_writing(self) -> None:
        self.write_waiter = self.loop.create_future()

    def resume_writing(self) -> None:
        self.last_data = self.loop.time()  # the upstream is taking the request: the read timeout counts from here
        self._wake_writer()

    # the parser's side

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value)
        if self.head_size > MAX_HEAD_BYTES:
            raise UpstreamError("reset", f"the upstream's headers passed {MAX_HEAD_BYTES} bytes")
        if len(self.raw_headers) >= MAX_HEADERS:
            raise UpstreamError("reset", f"the upstream sent more than {MAX_HEADERS} headers")
        self.raw_headers.append((name, value))

    def on_message_begin(self) -> None:
        # bytes after the answer, in the same packet: they cannot be an answer (RFC 9112 9.3), and left in the
        # parser they would be read as the start of the next request's
        if self.reply is None:
            raise UpstreamError("reset", "the upstream sent more than the answer asked for")

    def on_headers_complete(self) -> None:
        reply = self.reply
        assert reply is not None  # on_message_begin refused an answer without one
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:  # no request asks for an upgrade: what follows is not HTTP, and never an answer
                raise UpstreamError("reset", "the upstream switched protocols unasked")
            # an interim answer (103 Early Hints): the real one follows
            self.raw_headers = []
            self.interim = True
            return
        reply.status = status
        reply.headers = headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in self.raw_headers]
        codings = [v for k, v in headers if k == "transfer-encoding"]
        if codings and _codings(codings) != ["chunked"]:
            raise UpstreamError("reset", f"the upstream used a transfer coding the gateway does not decode: "
                                         f"{', '.join(codings)[:100]!r} (only chunked, as RFC 9112 6.1 allows)")
        reply.head_done = True
        if reply.head_only:  # llhttp cannot know a HEAD answer has no body: the next request gets a new parser
            self.stale_parser = True
            self._complete(reply, reuse=self.parser.should_keep_alive())
        reply.wake()

    def on_body(self, body: bytes) -> None:
        reply = self.reply
        if reply is None:  # the rest of a HEAD answer's declared length, which never comes
            return
        chunks = reply.chunks
        size = len(body)
        # small pieces after the first are gathered in one growing bytearray: a body in 1-byte chunks, read
        # whole, cost ~60 bytes of memory per byte as one bytes object each
        if size < SMALL_PIECE and chunks:
            last = chunks[-1]
            if isinstance(last, bytearray):
                last += body
            else:
                chunks.append(bytearray(body))
        else:
            chunks.append(body)
        reply.size += size
        if reply.unbounded:
            if reply.size > reply.limit:  # stops the parser: the connection is closed, the reader gets the error
                raise AnswerTooLarge(reply.limit)
        elif reply.size > HIGH_WATER and not self.reading_paused:
            self.reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        reply.wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        reply = self.reply
        if reply is not None:
            self._complete(reply, reuse=self.parser.should_keep_alive())

    # the client's side

    def send(self, head: bytes, body: Body, head_only: bool) -> _Reply:
        """Writes the request (a streamed body from a task of its own) and returns the reply to wait on."""
        if self.stale_parser:
            self.parser = httptools.HttpResponseParser(self)
            self.stale_parser = False
        if self.closed:
            raise UpstreamError("reset", "the upstream closed the connection before the request")
        reply = self.reply = _Reply(head_only)
        self.raw_headers = []
        self.head_bytes = self.head_size = 0
        transport = self.transport
        assert transport is not None
        if body is None or isinstance(body, bytes):
            if body and len(body) > BODY_WRITE_AT_ONCE:
                transport.write(head)
                transport.write(body)
            else:
                transport.write(head + body if body else head)
            self.request_sent = True
        else:
            self.request_sent = False
            transport.write(head)
            self.writer = self.loop.create_task(self._send_chunks(body))
        return reply

    async def wait(self, reply: _Reply, read_timeout: float, deadline: float | None = None) -> None:
        """Until the connection has news for `reply`: a timeout after `read_timeout` without data, or at `deadline`."""
        reply.waiter = waiter = self.loop.create_future()
        self.last_data = self.loop.time()
        self.read_timeout, self.deadline = read_timeout, deadline
        self.pool.watch(self)
        try:
            await waiter
        finally:
            self.pool.waiting.discard(self)
            reply.waiter = None

    def check_read(self, now: float) -> None:
        """Called by the pool's tick while a reader waits (data arrivals move `last_data`)."""
        if self.closed:
            return
        if self.deadline is not None and now >= self.deadline:
            self._fail(UpstreamError("timeout", "no answer within the route's total time"))
        elif now - self.last_data >= self.read_timeout:
            self._fail(UpstreamError("timeout", f"no data from the upstream for {self.read_timeout:g}s"))

    def resume(self) -> None:
        if self.reading_paused and not self.closed:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def abandon(self, reply: _Reply) -> None:
        """The reader is done with `reply` before its end: its connection cannot carry another request."""
        if self.reply is reply:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        writer = self.writer
        if writer is not None and not writer.done() and writer is not asyncio.current_task():
            writer.cancel()
        self._wake_writer()
        self.pool.dropped(self)

    # inside

    async def _send_chunks(self, chunks: AsyncIterable[bytes]) -> None:
        transport = self.transport
        assert transport is not None
        try:
            async for chunk in chunks:
                if chunk:
                    transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                    # the answer cannot be due while the request is still being sent: the read timeout counts
                    # from the last piece, as aiohttp's sock_read did
                    self.last_data = self.loop.time()
                    await self._drain()
            transport.write(b"0\r\n\r\n")
            self.last_data = self.loop.time()
            self.request_sent = True
        except Exception as exc:  # noqa: BLE001 - the connection's, or the body's own (too large): the reader raises it
            self._fail(exc)

    async def _drain(self) -> None:
        if self.write_waiter is not None:
            await self.write_waiter
        if self.closed:
            raise UpstreamError("reset", "the upstream closed the connection while the request was sent")

    def _wake_writer(self) -> None:
        waiter, self.write_waiter = self.write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ends_at_close(self, reply: _Reply) -> bool:
        """Whether the answer's body is framed by the connection's end: neither a length nor chunked (the only
        transfer coding let through)."""
        return not any(k in ("content-length", "transfer-encoding") for k, _ in reply.headers)

    def _complete(self, reply: _Reply, reuse: bool) -> None:
        reply.done = True
        self.reply = None
        reply.wake()
        if reuse and self.request_sent and not self.closed:
            self.resume()  # the last chunk may have paused it: the next answer must be read
            self.pool.give_back(self)
        else:
            self.close()

    def _fail(self, error: BaseException) -> None:
        reply = self.reply
        if reply is not None and reply.error is None:
            reply.error = error
            reply.wake()
        self.close()


class _Pool:
    """One origin's connections: idle ones kept for reuse, at most `size` lent at once."""

    def __init__(self, scheme: str, host: str, port: int, size: int, idle_timeout: float,
                 tls: ssl.SSLContext | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.tls = tls
        default_port = 443 if scheme == "https" else 80
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if port == default_port else f"{name}:{port}"
        self.size = size
        self.idle_timeout = idle_timeout
        self.idle: list[_Connection] = []  # oldest first
        self.lent = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.sweep: asyncio.TimerHandle | None = None
        # connections whose reader waits for data, checked for timeouts every TICK_SEC
        self.waiting: set[_Connection] = set()
        self.ticker: asyncio.TimerHandle | None = None

    def take(self) -> _Connection | None:
        """An idle connection, lent at once, when a slot is free and nobody is waiting for one."""
        if self.lent >= self.size or self.waiters:
            return None
        conn = self._reuse()
        if conn is not None:
            self.lent += 1
        return conn

    async def lease(self, timeouts: Timeouts, fresh: bool) -> _Connection:
        """A connection once a slot is free (by the deadline): an idle one unless `fresh`, else a new one."""
        if timeouts.deadline is None:
            await self._slot()
        else:
            try:
                async with asyncio.timeout_at(timeouts.deadline):
                    await self._slot()
            except TimeoutError as exc:
                raise UpstreamError("timeout", "no answer within the route's total time") from exc
        try:
            conn = None if fresh else self._reuse()
            if conn is None:
                conn = await self._connect(timeouts.connect)
                conn.leased = True
            return conn
        except BaseException:
            self._free_slot()
            raise

    def _reuse(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                conn.leased = conn.reused = True
                return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        conn.leased = False
        conn.idle_since = self.loop.time()
        self.idle.append(conn)
        if self.sweep is None:
            self.sweep = self.loop.call_later(self.idle_timeout, self._sweep)
        self._free_slot()

    def dropped(self, conn: _Connection) -> None:
        """`conn` is closed: its slot is free if it was lent, else it leaves the idle list."""
        if conn.leased:
            conn.leased = False
            self._free_slot()
        elif conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        for conn in list(self.idle):
            conn.close()
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep = None
        if self.ticker is not None:
            self.ticker.cancel()
            self.ticker = None

    def watch(self, conn: _Connection) -> None:
        self.waiting.add(conn)
        if self.ticker is None:
            self.ticker = self.loop.call_later(TICK_SEC, self._tick)

    def _tick(self) -> None:
        now = self.loop.time()
        for conn in list(self.waiting):
            conn.check_read(now)
        self.ticker = self.loop.call_later(TICK_SEC, self._tick) if self.waiting else None

    async def _slot(self) -> None:
        if self.lent < self.size and not self.waiters:
            self.lent += 1
            return
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            await waiter  # the slot is handed over with the result: `lent` already counts it
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()
            else:
                self.waiters.remove(waiter)
            raise

    def _free_slot(self) -> None:
        if self.lent <= self.size:  # above it (the bound was lowered), the slot goes instead
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self.lent -= 1

    def resize(self, size: int) -> None:
        """A new bound: a larger one lets requests waiting for a slot through at once, a smaller one takes
        effect as lent connections come back."""
        self.size = size
        while self.waiters and self.lent < self.size:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.lent += 1
                waiter.set_result(None)

    async def _connect(self, within: float) -> _Connection:
        where = f"{self.host}:{self.port}"
        try:
            async with asyncio.timeout(within):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None)
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"no connection to {where} within {within:g}s") from exc
        except OSError as exc:  # refused, unreachable, no such host, TLS handshake or certificate
            raise UpstreamError("connect_error", f"cannot connect to {where}: {exc}") from exc
        return conn

    def _sweep(self) -> None:
        self.sweep = None
        expired = self.loop.time() - self.idle_timeout
        while self.idle and self.idle[0].idle_since <= expired:
            self.idle[0].close()  # leaves the list through dropped()
        if self.idle:
            self.sweep = self.loop.call_later(self.idle[0].idle_since - expired, self._sweep)


class _Exchange:
    """The reading end of one response: its body whole, as a stream, or released unread."""

    __slots__ = ("conn", "deadline", "read_timeout", "released", "reply")

    def __init__(self, conn: _Connection, reply: _Reply, read_timeout: float, deadline: float | None) -> None:
        self.conn = conn
        self.reply = reply
        self.read_timeout = read_timeout
        # the request's deadline bounds a body read whole too (a streamed one goes on while data flows)
        self.deadline = deadline
        self.released = False

    def __aiter__(self) -> _Exchange:
        return self

    async def __anext__(self) -> bytes:
        reply = self.reply
        while not reply.chunks:
            if reply.error is not None:
                raise reply.error
            if reply.done:
                self.release()
                raise StopAsyncIteration
            await self.conn.wait(reply, self.read_timeout)
        chunks = reply.chunks
        first = chunks[0]
        # never the bytearray on_body still appends to
        data = first if len(chunks) == 1 and isinstance(first, bytes) else b"".join(chunks)
        chunks.clear()
        reply.size = 0
        if not reply.done:
            self.conn.resume()
        return data

    async def whole(self, limit: int) -> bytes:
        """The body, at most `limit` bytes (AnswerTooLarge past it), by the request's deadline."""
        reply = self.reply
        if reply.size > limit:
            self.release()
            raise AnswerTooLarge(limit)
        if not reply.done:
            reply.unbounded = True
            reply.limit = limit
            self.conn.resume()
        while not reply.done:
            if reply.error is not None:
                raise reply.error
            await self.conn.wait(reply, self.read_timeout, self.deadline)
        if reply.error is not None:
            raise reply.error
        return b"".join(reply.chunks)

    def release(self) -> None:
        if not self.released:
            self.released = True
            if not self.reply.done:
                self.conn.abandon(self.reply)

    def __del__(self) -> None:
        # a response dropped without release must not hold its pool slot for ever (aiohttp does the same)
        if not self.released and not self.reply.done:
            self.conn.abandon(self.reply)


class HttpClient:
    """The gateway's UpstreamClient (gateway/upstream.py)."""

    def __init__(self, pool_size: int = 200, idle_timeout: float = IDLE_TIMEOUT_SEC,
                 pool_sizes: dict[str, int] | None = None) -> None:
        """`pool_sizes`: the bound of each origin (scheme://host[:port], as URLs spell it) that has its own;
        any other origin's pool is bounded by `pool_size`."""
        self.pool_size = pool_size
        self.pool_sizes = pool_sizes or {}
        self.idle_timeout = idle_timeout
        self._pools: dict[str, _Pool] = {}
        self._tls: ssl.SSLContext | None = None

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body, timeouts: Timeouts
    ) -> GatewayResponse:
        pool, target = self._route(url)
        head = _head(method, target, pool.host_header, headers, body)
        fresh = False
        while True:
            conn = None if fresh else pool.take()
            if conn is None:
                conn = await pool.lease(timeouts, fresh)
            reply = None
            try:
                reply = conn.send(head, body, method == "HEAD")
                while not reply.head_done:
                    if reply.error is not None:
                        raise reply.error
                    await conn.wait(reply, timeouts.read, timeouts.deadline)
                break
            except _StaleConnection:
                if fresh or method not in IDEMPOTENT or not (body is None or isinstance(body, bytes)):
                    raise
                fresh = True
            except BaseException:
                # only while the connection is still this request's: a cancel that lands after the answer's end
                # finds it back in the pool, maybe lent to another request already
                if reply is None or conn.reply is reply:
                    conn.close()
                raise
        exchange = _Exchange(conn, reply, timeouts.read, timeouts.deadline)
        return GatewayResponse(reply.status, reply.headers, stream=exchange, release=exchange.release,
                               whole=exchange.whole)

    def resize(self, pool_sizes: dict[str, int]) -> None:
        self.pool_sizes = pool_sizes
        for origin, pool in self._pools.items():
            pool.resize(pool_sizes.get(origin, self.pool_size))

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _route(self, url: str) -> tuple[_Pool, str]:
        """The pool of the URL's origin, and the request target (path and query)."""
        found = _URL.match(url)
        if found is None:
            raise ValueError(f"not an absolute URL: {url!r}")
        origin, target = found.groups()
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = self._pool(origin)
        if not target or target[0] != "/":
            target = "/" + target
        return pool, target

    def _pool(self, origin: str) -> _Pool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        tls = None
        if parts.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        port = parts.port or (443 if tls is not None else 80)
        size = self.pool_sizes.get(origin, self.pool_size)
        return _Pool(parts.scheme, parts.hostname, port, size, self.idle_timeout, tls)


def _codings(values: list[str]) -> list[str]:
    """The transfer codings of an answer's transfer-encoding headers, in order, lowercased."""
    return [c.strip().lower() for v in values for c in v.split(",") if c.strip()]


def _head(method: str, target: str, host: str, headers: list[tuple[str, str]], body: Body) -> bytes:
    """The request line and headers, refused (ValueError) if a name or value could smuggle in a line, or if a
    header would frame or route the request (host, content-length, transfer-encoding: the client writes them)."""
    if not _VISIBLE.fullmatch(target):  # as aiohttp (yarl) did: spaces, controls, non-ASCII percent-encoded
        target = quote(target, safe=_TARGET_SAFE)
    fields = "".join([f"{k}\x00{v}\x01" for k, v in headers])
    if not _FIELDS.fullmatch(fields) or not _METHOD.fullmatch(method):
        raise ValueError("a request's method or header holds a character HTTP does not allow there, or names a "
                         "header only the client may write (host, content-length, transfer-encoding)")
    if body is None:
        framing = "" if method in NO_BODY_METHODS else "content-length: 0\r\n"
    elif isinstance(body, bytes):
        framing = f"content-length: {len(body)}\r\n"
    else:
        framing = "transfer-encoding: chunked\r\n"
    fields = fields.replace("\x00", ": ").replace("\x01", "\r\n")
    return f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n{fields}{framing}\r\n".encode("latin-1")
