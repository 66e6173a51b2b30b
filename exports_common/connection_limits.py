"""Bounds on what one connection may cost, enforced while the bytes arrive.

uvicorn's httptools protocol buffers a request's headers without limit and
waits for them forever: an endless header grows the process by its size, and a
client sending one byte a second holds its connection for good. `bounded_http`
subclasses that protocol (keeping its speed, see benchmarks/RESULTS.md) to add:
- the header section (request line included) is at most `max_header_bytes` plus
  a request-line allowance, and at most `max_headers` lines: else 431 and close;
- the headers must be complete `header_timeout_sec` after the request began
  (or after the connection opened): else 408 and close;
- a body that stops arriving for `body_idle_timeout_sec` (while the app is
  reading it) closes the connection; the app sees the client disconnect;
- at most `max_connections` connections per process: the next one gets 503 and close;
- a request that is not valid HTTP gets a 400 envelope, not uvicorn's plain text;
- a graceful shutdown begins for the whole process (`exports_common.shutdown`) when uvicorn
  asks a connection to shut down, so open event streams end at once.

It also tells the app an upper bound of each request's header size (`HEADER_BYTES_BOUND`
in the scope: the bytes read since the previous request's headers, up to and including
this one's), so the app's own exact check need not add the headers up when the bound is
already within its limit.
"""
from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from exports_common.envelope import error_body
from exports_common.errors import ApiError, ErrorKind
from exports_common.shutdown import begin as begin_shutdown

# the request line (method, path and query) may add this much to the header limit
REQUEST_LINE_ALLOWANCE = 8192
# the scope key of the bound: at least the sum of the lengths of the request's header names and values
HEADER_BYTES_BOUND = "exports.header_bytes_bound"


class _TooManyHeaders(Exception):
    pass


class ConnectionLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_headers: int = Field(100, ge=8, le=1000, description="header lines per request; more get 431")
    header_timeout_sec: float = Field(10.0, gt=0, description="time to send the whole header section; then 408")
    body_idle_timeout_sec: float = Field(30.0, gt=0, description="a body silent this long closes the connection")
    max_connections: int = Field(2048, ge=1, description="open connections per process; more get 503 and close")
    keep_alive_sec: int = Field(5, ge=1, description="an idle keep-alive connection is closed after this")


def networks(cidrs: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """CIDRs as networks; a bad one raises ValueError naming it (config validation)."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise ValueError(f"{cidr!r} is not an IP network in CIDR notation ({exc})") from exc
    return out


def _refusal(kind: ErrorKind, message: str, extra: bytes = b"") -> bytes:
    body = error_body(ApiError(kind, message))
    return (f"HTTP/1.1 {kind.status} {kind.name.replace('_', ' ').title()}\r\n".encode()
            + b"content-type: application/json\r\nconnection: close\r\n" + extra
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol held to the connection limits. Its own state is name-mangled
    (`self.__name`), so an attribute a uvicorn release adds to the base class cannot collide with it."""

    limits: ConnectionLimits = ConnectionLimits()
    max_header_bytes: int = 16384

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__header_bytes = 0  # read so far of a header section not yet complete
        self.__reading = 0  # the size of the read being parsed
        self.__too_large = False
        self.__header_timer: asyncio.TimerHandle | None = None
        self.__body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.__refuse(ErrorKind.UNAVAILABLE, "too many connections to this server; retry shortly",
                         b"retry-after: 1\r\n")
            return
        # a connection that sends nothing is held to the header timeout too
        self.__header_timer = self.loop.call_later(self.limits.header_timeout_sec, self.__headers_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self.__cancel_timers()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        begin_shutdown()
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        # The state is judged after the parser has run, from what uvicorn keeps: a scope without
        # a method is a request whose headers are still coming. This way the common case, a whole
        # request in one read, needs one check and no timer. A connection closed meanwhile (a refusal) may
        # still arm the body timer below: closing it cancels its timers.
        self.__reading = len(data)
        super().data_received(data)
        scope = self.scope
        if scope is not None and "method" not in scope:
            if self.transport.is_closing():  # refused while the parser ran: nothing more to count or time
                return
            self.__header_bytes += len(data)
            if self.__header_bytes > self.max_header_bytes + REQUEST_LINE_ALLOWANCE:
                self.__refuse_too_large()
            elif self.__header_timer is None:
                self.__header_timer = self.loop.call_later(self.limits.header_timeout_sec, self.__headers_too_slow)
            return
        if self.__header_timer is not None:
            self.__header_timer.cancel()
            self.__header_timer = None
        self.__header_bytes = 0
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_complete:
            self.__arm_body_timer()
        elif self.__body_timer is not None:
            self.__body_timer.cancel()
            self.__body_timer = None

    def on_headers_complete(self) -> None:
        if len(self.headers) > self.limits.max_headers:
            # raised through the parser, it comes back to send_400_response, which answers 431
            self.__too_large = True
            raise _TooManyHeaders
        # every byte of this header section is in the reads counted here (more, when reads held other requests)
        self.scope[HEADER_BYTES_BOUND] = self.__header_bytes + self.__reading  # type: ignore[literal-required]
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request it cannot parse: an envelope here, like every other error."""
        if self.__too_large:
            self.__refuse_too_large()
        else:
            self.__refuse(ErrorKind.BAD_REQUEST, "the request is not valid HTTP/1.1")

    def __refuse_too_large(self) -> None:
        self.__refuse(ErrorKind.HEADERS_TOO_LARGE, f"request headers must total at most {self.max_header_bytes}"
                                                  f" bytes in at most {self.limits.max_headers} lines")

    # -- timers ---------------------------------------------------------------------------------

    def __arm_body_timer(self) -> None:
        if self.__body_timer is not None:
            self.__body_timer.cancel()
        self.__body_timer = self.loop.call_later(self.limits.body_idle_timeout_sec, self.__body_too_slow)

    def __cancel_timers(self) -> None:
        for timer in (self.__header_timer, self.__body_timer):
            if timer is not None:
                timer.cancel()
        self.__header_timer = self.__body_timer = None

    def __headers_too_slow(self) -> None:
        self.__header_timer = None
        if self.cycle is not None and not self.cycle.response_complete and not self.transport.is_closing():
            # the next request's start arrived while this one is answered: its clock starts afterwards
            self.__header_timer = self.loop.call_later(self.limits.header_timeout_sec, self.__headers_too_slow)
            return
        scope = self.scope
        if (scope is None or "method" not in scope) and not self.transport.is_closing():
            self.__refuse(ErrorKind.REQUEST_TIMEOUT, f"send the request headers within "
                                                    f"{self.limits.header_timeout_sec:g} s")

    def __body_too_slow(self) -> None:
        self.__body_timer = None
        if self.flow.read_paused or self.cycle is None or not self.cycle.more_body:
            # the app is not reading (reads are paused) or the body is complete: nothing is late
            if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
                self.__arm_body_timer()
            return
        self.logger.info("request body idle for %.0f s; closing the connection", self.limits.body_idle_timeout_sec)
        self.transport.close()

    def __refuse(self, kind: ErrorKind, message: str, extra: bytes = b"") -> None:
        self.__cancel_timers()
        self.transport.write(_refusal(kind, message, extra))
        self.transport.close()


def bounded_http(limits: ConnectionLimits, max_header_bytes: int) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn's `http=` takes, with these limits."""
    return type("BoundedHttp", (BoundedHttpToolsProtocol,),
                {"limits": limits, "max_header_bytes": max_header_bytes})
