"""status_cache: terminal statuses are answered from a short cache; concurrent misses share one call.

Only terminal statuses are cached (a finished task does not change), per tenant
and task, for `ttl_sec`. A non-terminal answer carries `Retry-After`, 1 s doubling
to 30 s with the task's age, so well-behaved clients poll less as a task runs long.
Concurrent misses in one process share its call; with the cache in Redis, the
processes also share one call through a fill lease (gateway/plugins/fill_lease.py).
An entry that cannot be written (Redis failing) costs the cache, not the answer.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from typing import Any, ClassVar

from pydantic import Field
from redis.exceptions import RedisError

from exports_common.contract import TERMINAL, Status
from exports_common.timefmt import parse_rfc3339
from gateway.context import Handler, RequestContext
from gateway.kv import KeyValue
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.plugins.fill_lease import FillLease
from gateway.response import GatewayResponse, freeze, thaw
from gateway.services import Services
from gateway.telemetry import Tally

# decoded answers kept per route, so that a hit decodes nothing (the least recently hit dropped first), and
# fills' answers kept for a store read across an await (emptied when full); an entry costs its answer's size again
DECODED_ENTRIES = 1024

log = logging.getLogger("gateway.status_cache")


class StatusCacheSettings(Settings):
    ttl_sec: float = Field(5.0, gt=0, le=3600)
    terminal_statuses: list[Status] = Field(default_factory=lambda: sorted(TERMINAL))
    param: str = "task_id"
    poll_initial_sec: int = Field(1, ge=1)
    poll_max_sec: int = Field(30, ge=1)
    # with the cache in Redis: how long a process waits for another's fill of the same entry before it calls the
    # upstream itself (and how long a fill lease lives)
    fill_wait_sec: float = Field(1.0, gt=0, le=30)


def poll_interval(age_sec: float, initial: int, maximum: int) -> int:
    """initial, doubling each time the age doubles: 1 s under 2 s of age, 2 s under 4 s, ... capped."""
    if age_sec < 2 * initial:
        return initial
    return min(maximum, initial << int(math.log2(age_sec / initial)))


def _answer(snapshot: bytes, cache: str) -> GatewayResponse:
    resp, _ = thaw(snapshot)
    resp.set_header("x-cache", cache)
    return resp


def _hit_answer(raw: bytes) -> GatewayResponse:
    """A hit's answer, its headers encoded once for the copies sent."""
    return _answer(raw, "HIT").prepare()


def _store(services: Services) -> KeyValue:
    return services.state.kv("cache")


def _lookups(services: Services) -> Tally:
    return services.metrics.tally("gateway_status_cache", ("route", "result"),
                                  "status cache lookups: hit, miss, coalesced")


class StatusCache(PluginBase[StatusCacheSettings]):
    name: ClassVar[str] = "status_cache"
    Settings: ClassVar[type[StatusCacheSettings]] = StatusCacheSettings
    needs: ClassVar[frozenset[str]] = frozenset({"tenant"})  # entries are per tenant: one never reads another's

    def __init__(self, next: Handler, settings: StatusCacheSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.terminal = frozenset(settings.terminal_statuses)
        self.store = _store(services)
        self.get_now = self.store.get_now
        self.lease = FillLease(self.store, settings.fill_wait_sec) if services.state.redis is not None else None
        self.param = settings.param
        self.lookups = _lookups(services)
        for result in ("hit", "miss", "coalesced"):
            self.lookups.seed(self.route, result)
        self.hits = self.lookups.child((self.route, "hit"))  # the counter a hit adds to, found once
        self._in_flight: dict[str, asyncio.Future[bytes]] = {}
        # stored bytes -> their answer decoded: keyed by the bytes themselves, an entry serves a hit only while the
        # store returns those bytes
        self._decoded = functools.lru_cache(maxsize=DECODED_ENTRIES)(_hit_answer)
        # key -> (the answer of this process's latest fill, when it ended), for a store read across an await
        # (Redis): a miss read while the fill ran shares its answer, as a poll that came during the call does
        self._filled: dict[str, tuple[bytes, float]] = {}

    @classmethod
    async def stats(cls, services: Services) -> dict[str, Any]:
        lookups = _lookups(services)
        return {"status_cache": {"entries": _store(services).size(), "hits": lookups.total(result="hit"),
                                 "misses": lookups.total(result="miss"),
                                 "coalesced": lookups.total(result="coalesced")}}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        # `ctx.tenant_key(param)` as a hash tag, built in one step: the entry and its fill lease share a slot
        key = f"{{{ctx.tenant or '-'}:{ctx.params.get(self.param, '')}}}"
        if self.get_now is not None:
            raw = self.get_now(key)
        else:
            asked = time.monotonic()
            raw = await self.store.get(key)
            filled = self._filled.get(key) if raw is None else None
            if filled is not None and filled[1] >= asked:
                # the store was read while this process was filling it, and the fill ended before the read's
                # answer came: its answer is as fresh as a coalesced one, and a second upstream call is spared
                self.lookups.add(self.route, "coalesced")
                return _answer(filled[0], "MISS")
        if raw is not None:
            self.hits.inc()
            return self._decoded(raw).copy()
        while (leader := self._in_flight.get(key)) is not None:
            try:
                shared = await asyncio.shield(leader)
                self.lookups.add(self.route, "coalesced")
                return _answer(shared, "MISS")
            except asyncio.CancelledError:
                if not leader.cancelled():
                    raise
                # the leader's client went away: follow the next leader, or become it
        return _answer(await self._fetch(ctx, key), "MISS")

    async def _fetch(self, ctx: RequestContext, key: str) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            snapshot = await self._fill(ctx, key)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so an unawaited future does not warn
            raise
        finally:
            if self._in_flight.get(key) is future:
                del self._in_flight[key]
        future.set_result(snapshot)
        if self.get_now is None:
            if len(self._filled) >= DECODED_ENTRIES:
                self._filled.clear()
            self._filled[key] = (snapshot, time.monotonic())
        return snapshot

    async def _fill(self, ctx: RequestContext, key: str) -> bytes:
        """The answer for `key`: another process's fill when it holds the lease and ends within the wait, else
        this process's upstream call."""
        if self.lease is not None and (shared := await self.lease.acquire(key)) is not None:
            self.lookups.add(self.route, "coalesced")
            return shared
        self.lookups.add(self.route, "miss")
        try:
            return await self._snapshot(await self.next(ctx), key)
        finally:
            if self.lease is not None:
                await self.lease.release(key)

    async def _snapshot(self, resp: GatewayResponse, key: str) -> bytes:
        doc = await resp.json() if resp.status == 200 else None
        data = doc.get("data") if isinstance(doc, dict) else None
        status = data.get("status") if isinstance(data, dict) else None
        if isinstance(data, dict) and status is not None and status not in self.terminal \
                and isinstance(data.get("created_at"), str):
            age = max(0.0, time.time() - parse_rfc3339(data["created_at"]))
            resp.set_header("retry-after", str(poll_interval(age, self.settings.poll_initial_sec,
                                                             self.settings.poll_max_sec)))
        snapshot = freeze(resp, await resp.read())
        if status in self.terminal:
            try:
                await self.store.set(key, snapshot, self.settings.ttl_sec)
            except RedisError as exc:  # the next poll calls the upstream again; this one has its answer
                log.warning("status not cached: the shared cache failed", extra={"error": str(exc)})
        return snapshot
