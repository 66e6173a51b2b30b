"""The gateway with aiohttp's `ClientSession` as its upstream client, to measure the gateway's own on its routes.

Everything but the upstream client is the gateway's (app, config, plugins, policy); the
client is `AiohttpClient`, the gateway's UpstreamClient interface (gateway/upstream.py)
on one `ClientSession`, used the way aiohttp documents it:

- Pool: one `TCPConnector` holding at most the largest of the config's `pool_size`s per
  origin (no bound across origins), idle connections kept the gateway client's 30 s. The
  bounds are set at start: a reload does not change them.
- Requests: as the gateway's client sends them: no headers of aiohttp's own (user-agent,
  accept, accept-encoding), the target as given (already encoded), no redirects followed,
  no cookies kept, bodies passed on as they came (not decompressed).
- Timeouts: `connect` as `sock_connect`, `read` as `sock_read`, `deadline` as `total`
  (aiohttp's total also bounds a streamed body; the gateway's client lets one go on while
  data flows; a route whose answer is read whole, as the list call's, sees no difference).
- Failures: as the gateway's client names them for retry, breakers and outlier detection:
  `connect_error` (no connection), `timeout`, `reset` (anything else aiohttp raises);
  an answer read whole past its bound: AnswerTooLarge.

For benchmarks only (benchmarks/server_instructions.py --aiohttp-client,
benchmarks/bench_upstream_route.py); the product's client is gateway/http_client.py.

Run: python -m benchmarks.aiohttp_upstream run --config FILE (the gateway's config file)
"""
from __future__ import annotations

import sys
import time

import aiohttp
from yarl import URL

from exports_common import cli
from gateway import wiring
from gateway.app import Gateway
from gateway.config import GatewayConfig
from gateway.http_client import IDLE_TIMEOUT_SEC
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.upstream import AnswerTooLarge, Body, Timeouts, UpstreamError

# the headers aiohttp adds of its own accord; the gateway's client sends none of them
AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")


def failure(exc: BaseException) -> UpstreamError:
    """aiohttp's error as the gateway's client would have named it."""
    if isinstance(exc, TimeoutError):  # sock_connect, sock_read and total alike (aiohttp's subclass TimeoutError)
        return UpstreamError("timeout", f"aiohttp: {type(exc).__name__}: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unreachable, no such host, TLS
        return UpstreamError("connect_error", f"aiohttp: {exc}")
    return UpstreamError("reset", f"aiohttp: {type(exc).__name__}: {exc}")


class _Answer:
    """The reading end of one aiohttp response: its body whole (bounded), as a stream, or released unread."""

    __slots__ = ("resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    def __aiter__(self) -> _Answer:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self.resp.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise failure(exc) from exc
        if not chunk:  # the end: aiohttp has given the connection back
            raise StopAsyncIteration
        return chunk

    async def whole(self, limit: int) -> bytes:
        resp = self.resp
        if resp.content_length is not None and resp.content_length > limit:
            resp.release()
            raise AnswerTooLarge(limit)
        try:
            if resp.content_length is not None:  # aiohttp's own read, the length known to fit
                return await resp.read()
            chunks, size = [], 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > limit:
                    resp.close()
                    raise AnswerTooLarge(limit)
                chunks.append(chunk)
            return b"".join(chunks)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise failure(exc) from exc


class AiohttpClient:
    """The gateway's UpstreamClient (gateway/upstream.py) on one aiohttp `ClientSession`."""

    def __init__(self, pool_size: int) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=pool_size, keepalive_timeout=IDLE_TIMEOUT_SEC)
        self.session = aiohttp.ClientSession(connector=connector, skip_auto_headers=AUTO_HEADERS,
                                             cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False)

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body, timeouts: Timeouts
    ) -> GatewayResponse:
        total = None if timeouts.deadline is None else max(0.0, timeouts.deadline - time.monotonic())
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=timeouts.connect, sock_read=timeouts.read)
        try:
            resp = await self.session.request(method, URL(url, encoded=True), headers=headers, data=body,
                                              timeout=timeout, allow_redirects=False)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise failure(exc) from exc
        answer = _Answer(resp)
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in resp.raw_headers]
        return GatewayResponse(resp.status, headers, stream=answer, release=resp.release, whole=answer.whole)

    def resize(self, pool_sizes: dict[str, int]) -> None:
        """The bounds are the connector's, set at start (a benchmark does not reload)."""

    async def close(self) -> None:
        await self.session.close()


def open_services(config: GatewayConfig) -> Services:
    """The gateway's services, with an AiohttpClient bounded as the gateway's client would be in place of it."""
    services = product_open_services(config)
    services.client = AiohttpClient(max(config.pool_sizes().values()))
    return services


product_open_services = wiring.open_services


def create_app(config: GatewayConfig, config_path: str | None = None) -> Gateway:
    # `wiring.running` opens the services through the module's name: the swap takes effect at the lifespan's start
    wiring.open_services = open_services
    return Gateway(config, config_path)


if __name__ == "__main__":
    sys.exit(cli.main("benchmarks.aiohttp_upstream", GatewayConfig, "config/gateway.yaml", create_app))
