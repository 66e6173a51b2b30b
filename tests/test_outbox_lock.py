"""The shared outbox's drain lock: one gateway drains at a time, wherever the other gateways' steps fall.

Two gateways are two RedisOutbox stores on one private Redis, each with its own client. The race a review
found: gateway A holds the lock, its lease lapses, gateway B takes the lock, and A's renewal must then fail
and leave B's lock alone. Which of A's steps that lapse falls between is a matter of timing, so the test
puts it after each of the commands A's renewal sends in turn (A's client runs it as that command returns).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import redis.asyncio as aioredis

from gateway.plugins.outbox.store import RedisOutbox
from tests.procs import RedisServer

A_LEASE_SEC = 0.3  # A's first hold: short, so that it lapses within the test
RENEWAL_SEC = 60.0  # what A's renewal asks for: a lock stretched to it was stretched by A
B_LEASE_SEC = 30.0


class Interleaved(aioredis.Redis):
    """A client of the real server that runs `meanwhile` once its `at`-th command since `arm` has returned:
    another process's steps land there, between two of this client's commands."""

    sent = 0
    at = 0
    meanwhile: Callable[[], Awaitable[None]] | None = None

    def arm(self, at: int, meanwhile: Callable[[], Awaitable[None]]) -> None:
        self.sent, self.at, self.meanwhile = 0, at, meanwhile

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        result = await super().execute_command(*args, **options)
        self.sent += 1
        if self.sent == self.at and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        return result


async def lease_ends_or_renewed(observer: aioredis.Redis, key: str) -> None:
    """Until A's short lease has lapsed (the key is gone), or A's renewal has already stretched it."""
    deadline = time.monotonic() + A_LEASE_SEC + 5
    while time.monotonic() < deadline:
        left_ms = await observer.pttl(key)
        if left_ms == -2 or left_ms > A_LEASE_SEC * 1000:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the lock {key} neither lapsed nor was renewed")


async def lapse_then_b_takes(observer: aioredis.Redis, b: RedisOutbox, b_took: dict[str, Any]) -> None:
    """A's lease runs out, then gateway B tries the lock: `b_took` says what B's lock was when B took it."""
    await lease_ends_or_renewed(observer, b.lock_key)
    if await b.lock("gateway-b", B_LEASE_SEC):
        b_took.update(token=await observer.get(b.lock_key), left_ms=await observer.pttl(b.lock_key))


async def race_round(observer: aioredis.Redis, a_client: Interleaved, b_client: aioredis.Redis, at: int) -> bool:
    """A holds, then renews, its lease lapsing and B trying the lock after command `at` of that renewal (0: before
    it); False when the renewal sent fewer commands (no gap there to try)."""
    prefix = f"lock-race-{at}-{time.time_ns()}"  # each round a lock of its own
    a, b = RedisOutbox(a_client, prefix), RedisOutbox(b_client, prefix)
    key = a.lock_key
    assert await a.lock("gateway-a", A_LEASE_SEC)
    b_took: dict[str, Any] = {}
    if at == 0:
        await lapse_then_b_takes(observer, b, b_took)
    else:
        a_client.arm(at, lambda: lapse_then_b_takes(observer, b, b_took))
    a_renewed = await a.lock("gateway-a", RENEWAL_SEC)
    where = f"the lapse after command {at} of A's renewal"
    assert a_renewed != bool(b_took), f"{where}: A renewed {a_renewed}, B took the lock {bool(b_took)}"
    if b_took:
        assert await observer.get(key) == b_took["token"], f"{where}: B's lock is no longer B's"
        assert await observer.pttl(key) <= b_took["left_ms"], f"{where}: A stretched B's lock"
        await a.unlock("gateway-a")
        assert await observer.get(key) == b_took["token"], f"{where}: A's unlock freed B's lock"
    return at == 0 or a_client.meanwhile is None


async def test_a_renewal_after_the_lease_lapsed_and_another_gateway_took_the_lock_fails_and_leaves_it_alone(
        redis_server: RedisServer) -> None:
    observer = aioredis.Redis.from_url(redis_server.url)
    a_client = Interleaved(host="127.0.0.1", port=redis_server.port)
    b_client = aioredis.Redis.from_url(redis_server.url)
    try:
        at = 0
        while await race_round(observer, a_client, b_client, at):
            at += 1
        assert at >= 2, "A's renewal sends at least one command"
    finally:
        for client in (observer, a_client, b_client):
            await client.aclose()


async def test_the_holder_renews_others_wait_and_take_the_lock_once_it_is_given_up(redis_server: RedisServer) -> None:
    clients = [aioredis.Redis.from_url(redis_server.url) for _ in range(3)]
    observer, a_client, b_client = clients
    prefix = f"lock-turns-{time.time_ns()}"
    a, b = RedisOutbox(a_client, prefix), RedisOutbox(b_client, prefix)
    try:
        assert await a.lock("gateway-a", 2.0)
        assert not await b.lock("gateway-b", 2.0), "one drains at a time"
        assert await a.lock("gateway-a", 20.0), "the holder renews"
        assert await observer.pttl(a.lock_key) > 2_000, "its lease is the renewal's"
        await b.unlock("gateway-b")  # B holds nothing: A's lock stays
        assert not await b.lock("gateway-b", 2.0)
        await a.unlock("gateway-a")
        assert await b.lock("gateway-b", 2.0), "given up, the lock is the next gateway's"
        await a.unlock("gateway-a")  # A holds nothing any more: B's lock stays
        assert not await a.lock("gateway-a", 2.0)
    finally:
        for client in clients:
            await client.aclose()
