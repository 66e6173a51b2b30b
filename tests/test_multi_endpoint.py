"""Upstreams with several endpoints: balancing, and passive health (ejection and return).

The end-to-end test runs one gateway in front of two real backends on one private Redis; one
backend is killed with SIGKILL and started again on the same port.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.config import UpstreamConfig
from gateway.upstream import EndpointPool, OutlierPolicy
from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.helpers import backend_requests
from tests.procs import RedisServer, Service, wait_until

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
URLS = ["http://a:1", "http://b:2", "http://c:3"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_round_robin_spreads_calls_evenly() -> None:
    pool = EndpointPool(URLS, "round_robin", OutlierPolicy())
    picked = [pool.pick().url for _ in range(30)]
    assert {url: picked.count(url) for url in URLS} == dict.fromkeys(URLS, 10)


def test_least_requests_prefers_the_idle_endpoint() -> None:
    pool = EndpointPool(URLS, "least_requests", OutlierPolicy())
    pool.endpoints[0].in_flight = 5
    pool.endpoints[2].in_flight = 1
    assert {pool.pick().url for _ in range(10)} == {"http://b:2"}
    pool.endpoints[1].in_flight = 1
    assert {pool.pick().url for _ in range(10)} == {"http://b:2", "http://c:3"}


def test_consecutive_connect_failures_eject_for_a_growing_while_and_a_success_clears_them() -> None:
    clock = Clock()
    ejected: list[str] = []
    pool = EndpointPool(URLS[:2], "round_robin", OutlierPolicy(3, 10.0, 25.0), on_eject=ejected.append, clock=clock)
    a = pool.endpoints[0]
    pool.connect_failed(a)
    pool.connect_failed(a)
    pool.connected(a)  # not consecutive: the count starts again
    pool.connect_failed(a)
    pool.connect_failed(a)
    assert pool.ejected() == []
    pool.connect_failed(a)
    assert pool.ejected() == ["http://a:1"] and ejected == ["http://a:1"]
    assert {pool.pick().url for _ in range(5)} == {"http://b:2"}
    clock.now += 10.1
    assert pool.ejected() == []
    for _ in range(3):  # back, and still down: ejected again, for twice as long
        pool.connect_failed(a)
    clock.now += 15
    assert pool.ejected() == ["http://a:1"]
    clock.now += 5.1
    for _ in range(3):  # a third time: capped at max_ejection_sec
        pool.connect_failed(a)
    clock.now += 25.1
    assert pool.ejected() == []


def test_with_every_endpoint_ejected_the_soonest_back_is_tried() -> None:
    clock = Clock()
    pool = EndpointPool(URLS[:2], "round_robin", OutlierPolicy(1, 10.0, 60.0), clock=clock)
    pool.connect_failed(pool.endpoints[1])
    clock.now += 1
    pool.connect_failed(pool.endpoints[0])
    assert pool.pick().url == "http://b:2"
    pool.connected(pool.endpoints[1])  # it answered: back at once
    assert pool.ejected() == ["http://a:1"]


@pytest.mark.parametrize("fields", [{}, {"url": "http://a:1", "endpoints": ["http://b:2"]}, {"endpoints": []},
                                    {"endpoints": ["ftp://a"]}])
def test_an_upstream_names_its_endpoints_one_way(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        UpstreamConfig.model_validate(fields)
    assert UpstreamConfig.model_validate({"url": "http://a:1"}).urls == ["http://a:1"]


def _ejections(gateway: Service) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gateway_upstream_ejections_total{"))


def test_a_killed_endpoint_is_ejected_without_client_errors_and_comes_back(
        services: Callable[..., Service], tmp_path: Path) -> None:
    redis = RedisServer(tmp_path).start()
    try:
        backends = [services("backend_stub", backend_config(tmp_path / name, redis.url), name=name)
                    for name in ("b1", "b2")]
        upstream = {"endpoints": [b.url for b in backends], "balance": "round_robin",
                    "outlier_detection": {"consecutive_connect_failures": 2, "base_ejection_sec": 2}}
        config = gateway_config(tmp_path / "g", backends[0].url, redis.url)
        config["upstreams"]["exports"] = {**upstream, "service_token": config["upstreams"]["exports"]["service_token"]}
        gateway = services("gateway", config, name="g")

        def list_tasks() -> int:
            return httpx.get(f"{gateway.url}/api/v1/exports", headers=AUTH, timeout=10).status_code

        before = [backend_requests(b.url) for b in backends]
        assert [list_tasks() for _ in range(20)] == [200] * 20
        spread = [backend_requests(b.url) - n for b, n in zip(backends, before, strict=True)]
        assert spread == [10, 10], spread

        backends[1].kill()
        assert [list_tasks() for _ in range(20)] == [200] * 20  # a connect failure is retried elsewhere
        assert _ejections(gateway) >= 1
        assert backend_requests(backends[0].url) - before[0] >= 10 + 20

        backends[1].start()
        wait_until(lambda: list_tasks() == 200 and backend_requests(backends[1].url) > 0, 20, interval=0.2,
                   what="the restarted endpoint to get calls again after its ejection")
    finally:
        redis.stop()
