"""Transactions through the shared cluster wrapper (exports_common.redis_client) on a real Redis Cluster."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from redis.exceptions import WatchError

from exports_common.redis_client import HEALTH_CHECK_SEC, connect
from tests.procs import RedisClusterServers


@pytest.mark.parametrize("idle", [False, True], ids=["at-once", "idle-past-the-health-check"])
async def test_a_transaction_after_its_node_restarted_finds_a_live_connection(
        redis_cluster: RedisClusterServers, idle: bool) -> None:
    """The gateway's outbox removes an item in a MULTI/EXEC without WATCH: after the node restarted, the
    connections pooled before were closed by the server, and redis-py's one retry took the next stale one.
    Used at once, a stale connection fails reading MULTI's answer; idle past the health check, it fails the
    PING sent before the MULTI (an error that does not name its connection)."""
    tag = "{" + f"multi{time.time_ns()}" + "}"
    client = connect(redis_cluster.url)
    try:
        async def write(n: int) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(f"{tag}:a{n}", n)
                pipe.set(f"{tag}:b{n}", n)
                await pipe.execute()
        await asyncio.gather(*(write(n) for n in range(8)))  # eight pooled connections
        node = redis_cluster.owner(tag)
        redis_cluster.kill(node)
        redis_cluster.restart(node)
        if idle:  # the condition itself is time: the pooled connections idle past the health-check interval
            await asyncio.sleep(HEALTH_CHECK_SEC + 0.5)
        for n in range(6):
            await write(n)
    finally:
        await client.aclose()


async def test_a_watched_transaction_whose_connection_dropped_fails_instead_of_being_sent_without_its_watch(
        redis_cluster: RedisClusterServers) -> None:
    """WATCH holds on its connection only: redis-py sent a read after it, or the MULTI/EXEC, again on another
    connection without the WATCH, and the transaction wrote over another's write. Now it fails with a
    WatchError (as on one server), the pipeline reset, and the caller's next round reads the other's write."""
    key = "{" + f"watch{time.time_ns()}" + "}:k"
    client = connect(redis_cluster.url, decode_responses=True)
    other = redis.asyncio.Redis(port=redis_cluster.owner(key), decode_responses=True)

    async def drop_connections_and_write(value: str) -> None:
        await other.client_kill_filter(_type="normal", skipme=True)  # the pipeline's connection among them
        await other.set(key, value)

    try:
        await other.set(key, "before")
        async with client.pipeline(transaction=True) as pipe:
            await pipe.watch(key)
            await drop_connections_and_write("theirs")
            with pytest.raises(WatchError):  # a read after the WATCH
                await pipe.get(key)
            await pipe.watch(key)
            assert await pipe.get(key) == "theirs"
            await drop_connections_and_write("theirs again")
            pipe.multi()
            pipe.set(key, "blind")
            with pytest.raises(WatchError):  # the MULTI/EXEC
                await pipe.execute()
            await pipe.watch(key)
            assert await pipe.get(key) == "theirs again"
            pipe.multi()
            pipe.set(key, "checked")
            assert await pipe.execute() == [True]
        assert await other.get(key) == "checked"
    finally:
        await other.aclose()
        await client.aclose()
