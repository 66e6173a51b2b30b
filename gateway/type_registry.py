"""What each upstream's export-type registry says, as the gateway learns it: types, formats, callback allow-list.

The backend owns the registry. Each gateway process re-reads an upstream's `GET /export-types`
with `If-None-Match` every `REFRESH_SEC` (a 304 costs nothing), and once more, at most every
`MISS_REFRESH_SEC` with one call in flight, when a submit names a type or format it does not
know: a type just added to backend.yaml is then accepted at once. While the upstream cannot
be reached the registry learned last stays in force; until one was ever learned, the gateway
leaves the check to the backend.

The answer to the gateway's own fetch (made without a tenant) also holds the backend's
callback allow-list, which the validate plugin judges callback URLs with.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exports_common.netpolicy import AddressPolicy
from exports_common.periodic import periodic
from gateway.response import GatewayResponse
from gateway.services import Services, Upstream
from gateway.upstream import Timeouts, UpstreamError

log = logging.getLogger("gateway.type_registry")
REGISTRY_PATH = "/export-types"
REFRESH_SEC = 5.0
MISS_REFRESH_SEC = 1.0
SHARED_NAME = "export_type_registries"


class RegistryUnreadable(Exception):
    """The upstream's registry could not be read (unreachable, an error status, a body that is no registry)."""


@dataclass(frozen=True)
class Learned:
    """One answer of an upstream's registry."""

    formats: Mapping[str, tuple[str, ...]]  # export type -> the formats it offers, the default first
    callbacks: AddressPolicy = field(default_factory=AddressPolicy)
    etag: str | None = None

    @classmethod
    def parse(cls, body: bytes, etag: str | None) -> Learned:
        data = json.loads(body)["data"]
        formats = {str(item["export_type"]): tuple(str(f) for f in item.get("formats") or ())
                   for item in data["items"]}
        allowed = data.get("callbacks") or {}
        policy = AddressPolicy.from_lists(list(allowed.get("allow_hosts") or []),
                                          list(allowed.get("allow_networks") or []))
        return cls(formats, policy, etag)


class UpstreamRegistry:
    """The registry of one upstream, as last learned, and how it is refreshed."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.learned: Learned | None = None
        self._lock = asyncio.Lock()
        self._last_try = -math.inf

    async def refresh(self, services: Services) -> None:
        async with self._lock:
            await self._fetch(services)

    async def refresh_on_miss(self, services: Services) -> None:
        """Re-read before refusing an unknown type: at most once per MISS_REFRESH_SEC, one call in flight (a
        caller that finds one in flight waits for its answer)."""
        if self._lock.locked():
            async with self._lock:
                return
        if time.monotonic() - self._last_try < MISS_REFRESH_SEC:
            return
        async with self._lock:
            try:
                await self._fetch(services)
            except RegistryUnreadable as exc:
                log.warning("the backend's export types could not be read again; the registry learned last stays "
                            "in force", extra={"upstream": self.upstream, "error": str(exc)})

    async def _fetch(self, services: Services) -> None:
        self._last_try = time.monotonic()
        upstream = services.upstreams.get(self.upstream)
        if upstream is None:  # gone with a reload
            return
        headers = [*upstream.auth, *([("if-none-match", self.learned.etag)] if self.learned and self.learned.etag
                                     else [])]
        # a registry read waits at most a few seconds, whatever the upstream's own read timeout
        timeouts = Timeouts(connect=min(upstream.timeouts.connect, 2.0), read=min(upstream.timeouts.read, 5.0))
        resp, body = await self._read(services, upstream, headers, timeouts)
        if resp.status == 304:
            return
        if resp.status != 200:
            raise RegistryUnreadable(f"{self.upstream}: {REGISTRY_PATH} answered {resp.status}")
        try:
            learned = Learned.parse(body, resp.header("etag"))
        except (ValueError, KeyError, TypeError) as exc:
            raise RegistryUnreadable(f"{self.upstream}: {REGISTRY_PATH} answered no registry ({exc})") from exc
        if self.learned is None or learned.formats != self.learned.formats:
            log.info("export types learned", extra={"upstream": self.upstream, "types": sorted(learned.formats)})
        self.learned = learned


    async def _read(self, services: Services, upstream: Upstream, headers: list[tuple[str, str]],
                    timeouts: Timeouts) -> tuple[GatewayResponse, bytes]:
        """The first endpoint that answers, healthy ones first (in their order: a registry read never moves the
        round robin that proxied calls take turns by)."""
        now = upstream.pool.clock()
        endpoints = sorted(upstream.pool.endpoints, key=lambda e: e.ejected_until > now)
        failed: UpstreamError | None = None
        for endpoint in endpoints:
            try:
                resp = await services.client.request("GET", endpoint.url + REGISTRY_PATH, headers, None, timeouts)
                return resp, await resp.read()
            except UpstreamError as exc:
                failed = exc
        raise RegistryUnreadable(f"{self.upstream}: {failed}")


class Registries:
    """Every upstream's registry in this process (outlives config reloads)."""

    def __init__(self) -> None:
        self.by_upstream: dict[str, UpstreamRegistry] = {}

    def of(self, upstream: str) -> UpstreamRegistry:
        if upstream not in self.by_upstream:
            self.by_upstream[upstream] = UpstreamRegistry(upstream)
        return self.by_upstream[upstream]


def registries(services: Services) -> Registries:
    return services.state.shared(SHARED_NAME, Registries)


async def refresh_forever(current: Any) -> None:
    """Re-read every known upstream's registry every REFRESH_SEC; `current()` is the services in force."""

    async def step() -> None:
        services: Services = current()
        found = list(registries(services).by_upstream.values())
        results = await asyncio.gather(*(r.refresh(services) for r in found), return_exceptions=True)
        failed = [str(e) for e in results if isinstance(e, Exception)]
        if failed:
            raise RegistryUnreadable("; ".join(failed))

    await periodic("export type registry refresh", step, REFRESH_SEC, log, expected={
        RegistryUnreadable: "the backend's export types could not be read; the registry learned last stays in force "
                       "until it answers"})
