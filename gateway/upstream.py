"""The upstream HTTP client: the gateway's hot path, behind one small interface.

aiohttp was chosen by benchmark (benchmarks/upstream_client.py, figures in
benchmarks/RESULTS.md): its pooled session served several times the proxied
requests per second of httpx here. Nothing else in the gateway imports aiohttp;
failures leave this module as UpstreamError with a kind the retry and breaker
plugins understand.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterable, AsyncIterator, Literal, Protocol

import aiohttp

from gateway.response import GatewayResponse

FailureKind = Literal["connect_error", "timeout", "reset", "circuit_open"]
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Timeouts:
    connect: float = 2.0
    read: float = 30.0


class UpstreamError(Exception):
    """The upstream gave no usable answer; `retry_after` says when trying again makes sense."""

    def __init__(self, kind: FailureKind, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.retry_after = retry_after


Body = bytes | AsyncIterable[bytes] | None


class UpstreamClient(Protocol):
    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body, timeouts: Timeouts
    ) -> GatewayResponse: ...

    async def close(self) -> None: ...


def _classify(exc: BaseException) -> UpstreamError:
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamError("timeout", str(exc) or "no answer in time")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamError("connect_error", str(exc))
    return UpstreamError("reset", str(exc) or type(exc).__name__)


class AiohttpUpstream:
    def __init__(self, pool_size: int = 200) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=pool_size, keepalive_timeout=30),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body, timeouts: Timeouts
    ) -> GatewayResponse:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect, sock_read=timeouts.read)
        try:
            resp = await self.session.request(
                method, url, headers=headers, data=body, allow_redirects=False, timeout=timeout
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _classify(exc) from exc
        out_headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in resp.raw_headers]
        return GatewayResponse(resp.status, out_headers, stream=self._body(resp), release=resp.release)

    @staticmethod
    async def _body(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_chunked(CHUNK):
                yield chunk
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _classify(exc) from exc

    async def close(self) -> None:
        await self.session.close()
