"""Gateway processes on one Redis share one upstream call per finished task per TTL (the status cache's fill lease).

Real processes: two gateways, a private Redis, and an upstream that counts task reads and answers after a delay,
so that a storm's first polls reach both gateways while the first call is still out.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from exports_common.task_ids import new_task_id
from tests.conftest import DEMO_KEY, gateway_config
from tests.procs import RedisServer, Service, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
FILL_WAIT_SEC = 1.0
TTL_SEC = 30.0  # longer than the storm: every poll after the first fill is a hit
CLIENTS = 100  # per gateway, all starting at once
POLLS = 3  # by each client, back to back


def upstream(services: Callable[..., Service], name: str, delay_sec: float) -> Service:
    return services("tests.counting_upstream", {"delay_sec": delay_sec}, name=name)


def reads(counting: Service) -> int:
    return int(httpx.get(f"{counting.url}/calls").json()["data"]["reads"])


def gateway(services: Callable[..., Service], tmp_path: Path, name: str, upstream_url: str, redis: RedisServer,
            prefix: str) -> Service:
    config = gateway_config(tmp_path / name, upstream_url, redis.url, redis_prefix=prefix, gateway_processes=2)
    status = next(route for route in config["routes"] if route["name"] == "status")
    for plugin in status["plugins"]:
        if isinstance(plugin, dict) and "status_cache" in plugin:
            plugin["status_cache"] = {"ttl_sec": TTL_SEC, "fill_wait_sec": FILL_WAIT_SEC}
    return services("gateway", config, name=name)


async def storm(urls: list[str], task_id: str) -> list[int]:
    """CLIENTS connections per gateway, each polling `task_id` POLLS times back to back; every answer's status."""
    statuses: list[int] = []

    async def poll(http: httpx.AsyncClient) -> int:
        try:
            return (await http.get(f"{API}/{task_id}")).status_code
        except httpx.RemoteProtocolError:  # a kept-alive connection the server closed as it was reused: once more
            return (await http.get(f"{API}/{task_id}")).status_code

    async def client(http: httpx.AsyncClient) -> None:
        for _ in range(POLLS):
            statuses.append(await poll(http))

    limits = httpx.Limits(max_connections=CLIENTS)
    clients = [httpx.AsyncClient(base_url=url, headers=AUTH, timeout=20, limits=limits) for url in urls]
    try:
        await asyncio.gather(*(client(http) for http in clients for _ in range(CLIENTS)))
    finally:
        for http in clients:
            await http.aclose()
    return statuses


def test_a_storm_over_two_gateways_on_one_redis_makes_one_upstream_call(
        services: Callable[..., Service], tmp_path: Path, redis_server: RedisServer) -> None:
    counting = upstream(services, "counting", delay_sec=0.3)
    prefix = f"lease-storm-{time.time_ns()}"
    gateways = [gateway(services, tmp_path, f"gateway-{i}", counting.url, redis_server, prefix) for i in range(2)]
    task_id = new_task_id()
    statuses = asyncio.run(storm([g.url for g in gateways], task_id))
    assert statuses == [200] * (2 * CLIENTS * POLLS), {s: statuses.count(s) for s in set(statuses)}
    assert reads(counting) == 1, "two processes sharing the cache must make one upstream call per TTL in total"


def test_a_lease_holder_killed_mid_fill_delays_the_others_at_most_the_fill_wait(
        services: Callable[..., Service], tmp_path: Path, redis_server: RedisServer) -> None:
    hanging, counting = upstream(services, "hanging", delay_sec=60), upstream(services, "counting", delay_sec=0)
    prefix = f"lease-kill-{time.time_ns()}"
    holder = gateway(services, tmp_path, "holder", hanging.url, redis_server, prefix)
    other = gateway(services, tmp_path, "other", counting.url, redis_server, prefix)
    task_id = new_task_id()
    outcome: list[Any] = []

    def poll_holder() -> None:
        try:
            outcome.append(httpx.get(f"{holder.url}{API}/{task_id}", headers=AUTH, timeout=30))
        except httpx.HTTPError as exc:  # its gateway is killed under it
            outcome.append(exc)

    first = threading.Thread(target=poll_holder)
    first.start()
    redis = redis_server.client()
    wait_until(lambda: redis.keys(f"{prefix}:cache:*:fill"), 10, what="the holder to take the fill lease")
    wait_until(lambda: reads(hanging) == 1, 10, what="the holder's upstream call")
    holder.kill()  # SIGKILL, mid-fill: its lease is left in Redis until it expires
    assert redis.keys(f"{prefix}:cache:*:fill"), "the killed holder's lease must still be there"
    started = time.monotonic()
    answer = httpx.get(f"{other.url}{API}/{task_id}", headers=AUTH, timeout=30)
    elapsed = time.monotonic() - started
    first.join(30)
    assert answer.status_code == 200 and answer.json()["data"]["status"] == "COMPLETED", answer.text
    assert elapsed < FILL_WAIT_SEC + 1.5, f"waited {elapsed:.2f} s for a dead holder's fill"
    assert reads(counting) == 1
    assert isinstance(outcome[0], httpx.HTTPError), outcome
