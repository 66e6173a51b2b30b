"""The upstream HTTP client: the gateway's hot path, behind one small interface.

aiohttp was chosen by benchmark (benchmarks/upstream_client.py, figures in
benchmarks/RESULTS.md): its pooled session served several times the proxied
requests per second of httpx here. Nothing else in the gateway imports aiohttp;
failures leave this module as UpstreamError with a kind the retry and breaker
plugins understand.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

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
        return GatewayResponse(resp.status, out_headers, stream=self._body(resp), release=resp.release,
                               whole=lambda: self._whole(resp))

    @staticmethod
    async def _body(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_chunked(CHUNK):
                yield chunk
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _classify(exc) from exc

    @staticmethod
    async def _whole(resp: aiohttp.ClientResponse) -> bytes:
        try:
            return await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _classify(exc) from exc

    async def close(self) -> None:
        await self.session.close()


Balance = Literal["round_robin", "least_requests"]


@dataclass(frozen=True)
class OutlierPolicy:
    """Passive health, after Envoy's outlier detection: consecutive connect failures eject an endpoint."""

    consecutive_connect_failures: int = 3
    base_ejection_sec: float = 10.0
    max_ejection_sec: float = 300.0


@dataclass
class Endpoint:
    url: str
    in_flight: int = 0
    failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0


class EndpointPool:
    """One upstream's endpoints: which one the next call goes to, and which are resting.

    An endpoint that fails to connect `consecutive_connect_failures` times in a row is left out
    for `base_ejection_sec` times the number of its ejections so far (capped), so one that keeps
    dying rests longer each time; a call that connects clears its count. When every endpoint is
    ejected, the one that comes back soonest is used anyway: a guess beats refusing outright.
    """

    def __init__(self, urls: list[str], balance: Balance, policy: OutlierPolicy,
                 on_eject: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.balance = balance
        self.policy = policy
        self.on_eject = on_eject
        self.clock = clock
        self._next = 0

    def pick(self) -> Endpoint:
        now = self.clock()
        healthy = [e for e in self.endpoints if e.ejected_until <= now]
        if not healthy:
            return min(self.endpoints, key=lambda e: e.ejected_until)
        if self.balance == "least_requests":
            fewest = min(e.in_flight for e in healthy)
            healthy = [e for e in healthy if e.in_flight == fewest]
        self._next += 1
        return healthy[self._next % len(healthy)]

    def connected(self, endpoint: Endpoint) -> None:
        """A call reached it: its failure count clears, and one used while ejected is back at once."""
        endpoint.failures = 0
        if endpoint.ejected_until > self.clock():
            endpoint.ejected_until = 0.0
        else:
            endpoint.ejections = 0

    def connect_failed(self, endpoint: Endpoint) -> None:
        endpoint.failures += 1
        if endpoint.failures < self.policy.consecutive_connect_failures:
            return
        endpoint.failures = 0
        endpoint.ejections += 1
        rest = min(self.policy.base_ejection_sec * endpoint.ejections, self.policy.max_ejection_sec)
        endpoint.ejected_until = self.clock() + rest
        if self.on_eject is not None:
            self.on_eject(endpoint.url)

    def ejected(self) -> list[str]:
        now = self.clock()
        return [e.url for e in self.endpoints if e.ejected_until > now]
