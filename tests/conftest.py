from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.procs import RedisServer, Service, load_default, merge

DEMO_KEY = "demo-key-change-me"
DEMO2_KEY = "demo2-key-change-me"
ADMIN_TOKEN = "admin-change-me"

# Export types the tests add to the default ones: slow, flaky and broken on purpose.
TEST_EXPORT_TYPES: dict[str, Any] = {
    "slow_export": {"dataset": "orders", "rows": 20000, "seed": 5, "fault": {"delay_sec": 30}},
    "flaky_export": {"dataset": "orders", "rows": 2000, "seed": 6, "max_attempts": 3,
                     "fault": {"fail_first_attempts": 1}},
    "broken_export": {"dataset": "orders", "rows": 2000, "seed": 7, "max_attempts": 2,
                      "fault": {"failure_rate": 1.0}},
    "big_export": {"dataset": "orders", "rows": 1_000_000, "seed": 8},
}


# Tests and benchmarks send many requests from one tenant (and one address): their gateways run with
# the limits raised through the shipped config's variables. The limiter still runs on every request;
# tests/test_limits.py sets its own low limits in the config itself.
RAISED_LIMITS = {name: "1000000" for name in (
    "TENANT_REQUESTS_PER_SEC", "TENANT_REQUESTS_BURST", "TENANT_SUBMITS_PER_SEC", "TENANT_SUBMITS_BURST",
    "TENANT_MAX_ACTIVE_TASKS", "ADDRESS_REQUESTS_PER_SEC", "ADDRESS_REQUESTS_BURST",
)}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; .ci/run installs it (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


def backend_config(workdir: Path, redis_url: str = "", **override: Any) -> dict[str, Any]:
    base = merge(load_default("backend.yaml"), {
        "data_dir": str(workdir / "backend-data"), "redis_url": redis_url, "progress_interval_sec": 0.1,
        "export_types": TEST_EXPORT_TYPES, "log_level": "info",
    })
    return merge(base, override)


def gateway_config(workdir: Path, backend_url: str, redis_url: str = "", **override: Any) -> dict[str, Any]:
    base = load_default("gateway.yaml")
    base = merge(base, {
        "state_dir": str(workdir / "gateway-state"), "redis_url": redis_url,
        "upstreams": {"exports": {"url": backend_url}}, "public_base_url": "",
    })
    for route in base["routes"]:
        for plugin in route["plugins"]:
            if isinstance(plugin, dict) and "validate" in plugin:
                plugin["validate"]["export_types"] = None
                plugin["validate"]["callback"] = {"allow_hosts": [], "allow_networks": ["127.0.0.0/8"]}
    return merge(base, override)


@contextlib.contextmanager
def _starter(workdir: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(module: str, config: dict[str, Any], name: str | None = None, **env: str) -> Service:
        if module == "gateway":
            env = RAISED_LIMITS | env
        service = Service(module, config, workdir, name or f"{module}-{len(started)}", env=env).start()
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in reversed(started):
            service.stop()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Start backend or gateway processes for one test; all are stopped at its end."""
    with _starter(tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def module_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Service]]:
    """Like `services`, for processes shared by every test of a module."""
    with _starter(tmp_path_factory.mktemp("services")) as start:
        yield start
