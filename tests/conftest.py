from __future__ import annotations

import base64
import contextlib
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from gateway.tenants import hash_key
from tests.databases import (
    MARIADB,
    POSTGRES,
    SERVERS,
    MariaDBInstance,
    PostgresInstance,
    SqlDatabase,
    scratch_database,
    server_home,
)
from tests.procs import RedisClusterServers, RedisServer, Service, free_port, load_default, merge

# The suite runs in production mode: secrets are generated for each session (never the published
# ones, which both processes refuse outside dev mode) and every gateway has a public_base_url.
DEMO_KEY = secrets.token_urlsafe(24)
DEMO2_KEY = secrets.token_urlsafe(24)
ADMIN_TOKEN = secrets.token_urlsafe(24)
SIGNING_SECRET = secrets.token_urlsafe(32)
WEBHOOK_SECRETS = {tenant: "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
                   for tenant in ("demo", "demo2")}
# the public URL the backend's callback links use (the gateways of the tests each have their own)
PUBLIC_URL = "https://exports.example.test"

def synthetic_type(dataset: str, rows: int, seed: int = 1, **fields: Any) -> dict[str, Any]:
    """An export type reading a synthetic data set, with any other type-level `fields` (formats, fault, ...)."""
    return {"source": {"kind": "synthetic", "dataset": dataset, "rows": rows, "seed": seed}, **fields}


# Export types the tests add to the default ones: slow, flaky and broken on purpose.
TEST_EXPORT_TYPES: dict[str, Any] = {
    "slow_export": synthetic_type("orders", 20000, 5, fault={"delay_sec": 30}),
    "flaky_export": synthetic_type("orders", 2000, 6, max_attempts=3, fault={"fail_first_attempts": 1}),
    "broken_export": synthetic_type("orders", 2000, 7, max_attempts=2, fault={"failure_rate": 1.0}),
    "big_export": synthetic_type("orders", 1_000_000, 8),
}


# Tests and benchmarks send many requests from one tenant (and one address): their gateways run with
# the limits raised through the shipped config's variables. The limiter still runs on every request;
# tests/test_limits.py sets its own low limits in the config itself.
RAISED_LIMITS = {name: "1000000" for name in (
    "TENANT_REQUESTS_PER_SEC", "TENANT_REQUESTS_BURST", "TENANT_SUBMITS_PER_SEC", "TENANT_SUBMITS_BURST",
    "TENANT_MAX_ACTIVE_TASKS", "TENANT_MAX_OPEN_STREAMS", "ADDRESS_REQUESTS_PER_SEC", "ADDRESS_REQUESTS_BURST",
)}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; .ci/run installs it (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A private three-node Redis Cluster on free ports, for one test module."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are missing; .ci/run installs them (apt-get install redis-server)")
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Service, Service]:
    """A backend and a gateway in front of it on the default configs, for one test module: (backend, gateway)."""
    workdir = tmp_path_factory.mktemp("stack")
    backend = module_services("backend_stub", backend_config(workdir))
    gateway = module_services("gateway", gateway_config(workdir, backend.url))
    return backend, gateway


def backend_config(workdir: Path, redis_url: str = "", **override: Any) -> dict[str, Any]:
    base = merge(load_default("backend.yaml"), {
        "port": 0, "data_dir": str(workdir / "backend-data"), "redis_url": redis_url, "progress_interval_sec": 0.1,
        "export_types": TEST_EXPORT_TYPES, "log_level": "info",
        "callbacks": {"secrets": {tenant: [secret] for tenant, secret in WEBHOOK_SECRETS.items()}},
        "download_links": {"base_url": PUBLIC_URL, "secrets": [SIGNING_SECRET]},
    })
    return merge(base, override)


def gateway_config(workdir: Path, backend_url: str, redis_url: str = "", base: dict[str, Any] | None = None,
                   **override: Any) -> dict[str, Any]:
    """The shipped gateway.yaml (or `base`), made to serve the test's backend with the session's secrets."""
    base = base if base is not None else load_default("gateway.yaml")
    port = free_port()  # known before the start, so that the public URL can name it
    base = merge(base, {
        "port": port, "public_base_url": f"http://127.0.0.1:{port}",
        "state_dir": str(workdir / "gateway-state"), "redis_url": redis_url,
        "upstreams": {"exports": {"url": backend_url}},
        "admin_token": ADMIN_TOKEN, "download_signing": {"secrets": [SIGNING_SECRET]},
        "tenants": {"demo": {"api_key_hashes": [hash_key(DEMO_KEY)]},
                    "demo2": {"api_key_hashes": [hash_key(DEMO2_KEY)]}},
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

    def start(module: str, config: dict[str, Any], name: str | None = None, args: tuple[str, ...] = (),
              **env: str) -> Service:
        if module == "gateway":
            env = RAISED_LIMITS | env
        service = Service(module, config, workdir, name or f"{module}-{len(started)}", env=env, args=args).start()
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


# ---------------------------------------------------------------------------------------------------
# SQL databases (tests/databases.py): a database of the test's own on the machine's PostgreSQL and
# MariaDB, or a private server for tests that restart, kill or pause it.

@pytest.fixture
def pg_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """A new database on the machine's PostgreSQL (TEST_POSTGRES_URL), dropped after the test."""
    with scratch_database(POSTGRES, request.node.name) as database:
        yield database


@pytest.fixture
def mariadb_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """A new database on the machine's MariaDB (TEST_MARIADB_URL), dropped after the test."""
    with scratch_database(MARIADB, request.node.name) as database:
        yield database


@pytest.fixture(params=sorted(SERVERS))
def sql_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """The test runs once per server (ids mariadb, postgresql), each time with a new database."""
    with scratch_database(SERVERS[request.param], request.node.name) as database:
        yield database


@pytest.fixture(scope="module")
def module_pg_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """`pg_database` shared by the tests of a module (they must not depend on each other's rows)."""
    with scratch_database(POSTGRES, request.module.__name__) as database:
        yield database


@pytest.fixture(scope="module")
def module_mariadb_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """`mariadb_database` shared by the tests of a module."""
    with scratch_database(MARIADB, request.module.__name__) as database:
        yield database


@pytest.fixture(scope="module", params=sorted(SERVERS))
def module_sql_database(request: pytest.FixtureRequest) -> Iterator[SqlDatabase]:
    """`sql_database` shared by the tests of a module: one database per server."""
    with scratch_database(SERVERS[request.param], request.module.__name__) as database:
        yield database


@contextlib.contextmanager
def _template(kind: type[PostgresInstance] | type[MariaDBInstance]) -> Iterator[Path]:
    home = server_home(f"{kind.kind}-template")
    try:
        yield kind.make_template(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[Path]:
    """A PostgreSQL data directory made once per session; private instances start from copies of it."""
    with _template(PostgresInstance) as home:
        yield home


@pytest.fixture(scope="session")
def mariadb_template() -> Iterator[Path]:
    """A MariaDB data directory made once per session; private instances start from copies of it."""
    with _template(MariaDBInstance) as home:
        yield home


@pytest.fixture
def private_postgres(postgres_template: Path) -> Iterator[PostgresInstance]:
    """A PostgreSQL of this test's own, started, on a free port: restart, kill9, pause it at will."""
    with PostgresInstance.running(postgres_template) as instance:
        yield instance


@pytest.fixture
def private_mariadb(mariadb_template: Path) -> Iterator[MariaDBInstance]:
    """A MariaDB of this test's own, started, on a free port: restart, kill9, pause it at will."""
    with MariaDBInstance.running(mariadb_template) as instance:
        yield instance
