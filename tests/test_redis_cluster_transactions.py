"""Transactions through the shared cluster wrapper (exports_common.redis_client) on a real Redis Cluster."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError, MaxConnectionsError, WatchError

from exports_common import redis_client
from exports_common.redis_client import HEALTH_CHECK_SEC, connect, learn_cluster
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
    connection without the WATCH, and the transaction wrote over another's write. Now a read fails with a
    WatchError (as on one server: nothing was written), the pipeline reset, and the caller's next round reads
    the other's write; the MULTI/EXEC fails with its connection error (it may have been applied: a caller's
    loop must not apply it again) and writes nothing blind."""
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
            with pytest.raises(ConnectionError):  # the MULTI/EXEC: its outcome unknown to the client
                await pipe.execute()
            await pipe.reset()
            await pipe.watch(key)
            assert await pipe.get(key) == "theirs again"
            pipe.multi()
            pipe.set(key, "checked")
            assert await pipe.execute() == [True]
        assert await other.get(key) == "checked"
    finally:
        await other.aclose()
        await client.aclose()


async def test_a_full_pool_on_one_node_leaves_the_other_nodes_connections_alone(
        redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's pool at its bound (MaxConnectionsError, a ConnectionError) says nothing of stale connections:
    a transaction refused by it must not make every node reconnect (under the load that filled the pool)."""
    monkeypatch.setattr(redis_client, "MAX_CONNECTIONS", 8)
    client = connect(redis_cluster.url)
    tag = "{" + f"full{time.time_ns()}" + "}"
    busy = redis_cluster.owner(tag)
    others = {port: next(f"k{i}" for i in range(10_000) if redis_cluster.owner(f"k{i}") == port)
              for port in redis_cluster.ports if port != busy}

    def received(port: int) -> int:
        with redis.Redis(port=port) as server:
            return int(server.info("stats")["total_connections_received"])

    async def traffic() -> None:
        await asyncio.gather(*(client.get(key) for key in others.values() for _ in range(8)))

    try:
        assert isinstance(client, redis.asyncio.RedisCluster)
        await client.ping()  # the client learns the cluster before a burst of commands
        await traffic()
        before = {port: received(port) for port in others}
        node = client.get_node_from_key(f"{tag}:a")
        assert node is not None
        held = []
        while True:  # every connection of the busy node in use, as by a storm of slow commands
            try:
                held.append(node.acquire_connection())
            except MaxConnectionsError:
                break
        with pytest.raises(MaxConnectionsError):
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(f"{tag}:a", 1)
                await pipe.execute()
        for connection in held:
            node.release(connection)
        await traffic()
        # the probes' own connections only (one a node): none of the client's reconnected
        assert sum(received(port) - before[port] for port in others) <= len(others)
    finally:
        await client.aclose()


async def test_a_client_that_learnt_the_cluster_at_its_start_serves_its_first_burst(
        redis_cluster: RedisClusterServers) -> None:
    """redis-py learns a cluster's nodes on the first command, and of a burst of first commands at once some
    failed with a ConnectionError (a 503 for a process's first requests); the gateway and the backend call
    learn_cluster when they start."""
    client = connect(redis_cluster.url)
    try:
        await learn_cluster(client)
        answers = await asyncio.gather(*(client.get(f"burst{n}") for n in range(16)), return_exceptions=True)
        assert [a for a in answers if isinstance(a, BaseException)] == []
    finally:
        await client.aclose()
