"""The gateway's registry reader against a real HTTP server of the test's own: ETag revalidation, and the
refresh a miss triggers (at most once a second per upstream, one call in flight, concurrent misses waiting on it)."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gateway.http_client import HttpClient
from gateway.services import Services, Upstream
from gateway.type_registry import MISS_REFRESH_SEC, UpstreamRegistry
from gateway.upstream import EndpointPool, OutlierPolicy, Timeouts

pytestmark = pytest.mark.inprocess  # no server process: an asyncio server in the test's own loop


class RegistryServer:
    """Answers GET /export-types with `types`, an ETag and 304 to it, after `delay_sec`; counts what it got."""

    def __init__(self) -> None:
        self.types: dict[str, list[str]] = {"orders": ["csv"]}
        self.delay_sec = 0.0
        self.requests: list[str | None] = []  # the If-None-Match of each
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.decode().split("\r\n")
            tag = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("if-none-match")),
                       None)
            self.requests.append(tag)
            await asyncio.sleep(self.delay_sec)
            body = json.dumps({"code": 0, "message": "success", "data": {
                "items": [{"export_type": n, "formats": f} for n, f in self.types.items()],
                "callbacks": {"allow_hosts": ["hooks.internal"], "allow_networks": []}}}).encode()
            etag = f'"{hash(body) & 0xFFFFFFFF:x}"'
            status, body = ("304 Not Modified", b"") if tag == etag else ("200 OK", body)
            writer.write(f"HTTP/1.1 {status}\r\nETag: {etag}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()


@pytest.fixture
async def served() -> AsyncIterator[tuple[RegistryServer, Services]]:
    server = RegistryServer()
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    client = HttpClient(4)
    pool = EndpointPool([server.url], "round_robin", OutlierPolicy())
    # what a registry read uses of the services: the upstream client and the upstreams
    services = cast(Services, type("Bare", (), {"client": client, "upstreams": {
        "exports": Upstream("exports", pool, Timeouts(connect=2, read=5))}})())
    try:
        yield server, services
    finally:
        await client.close()
        listening.close()


async def test_a_refresh_revalidates_with_the_etag_and_learns_a_change(served: tuple[RegistryServer, Any]) -> None:
    server, services = served
    registry = UpstreamRegistry("exports")
    await registry.refresh(services)
    assert registry.learned is not None and dict(registry.learned.formats) == {"orders": ("csv",)}
    assert "hooks.internal" in registry.learned.callbacks.allow_hosts
    first = registry.learned
    await registry.refresh(services)
    assert registry.learned is first and server.requests[1] == first.etag  # a 304: nothing changed
    server.types["users"] = ["jsonl", "csv"]
    await registry.refresh(services)
    assert registry.learned.formats["users"] == ("jsonl", "csv")


async def test_misses_refresh_at_most_once_a_second_and_wait_for_the_call_in_flight(
        served: tuple[RegistryServer, Any]) -> None:
    server, services = served
    registry = UpstreamRegistry("exports")
    server.delay_sec = 0.3
    await asyncio.gather(*(registry.refresh_on_miss(services) for _ in range(20)))
    assert len(server.requests) == 1 and registry.learned is not None  # every caller saw the one answer
    await asyncio.gather(*(registry.refresh_on_miss(services) for _ in range(20)))
    assert len(server.requests) == 1  # within the second: no new call
    await asyncio.sleep(MISS_REFRESH_SEC)
    await registry.refresh_on_miss(services)
    assert len(server.requests) == 2
