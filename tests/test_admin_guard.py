"""The admin API against guessing and leaks, and per-address limits that count clients behind a trusted proxy."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import yaml

from scripts import run_cluster
from tests.conftest import ADMIN_TOKEN, gateway_config
from tests.procs import ROOT, Service, free_port, wait_until
from tests.test_observability import metric, scrape

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-admin-token-0123456789abcdef"}


def test_admin_routes_mask_every_password_and_token(services: Callable[..., Service], tmp_path: Path) -> None:
    upstream = f"http://exports:up-s3cret@127.0.0.1:{free_port()}"
    config = gateway_config(tmp_path, upstream, f"redis://:redis-s3cret@127.0.0.1:{free_port()}/0")
    config["upstreams"]["exports"]["service_token"] = "service-token-s3cret"
    gateway = services("gateway", config)
    shown = httpx.get(f"{gateway.url}/admin/routes", headers=ADMIN, timeout=10)
    assert shown.status_code == 200, shown.text
    text = shown.text
    for secret in ("up-s3cret", "redis-s3cret", "service-token-s3cret", ADMIN_TOKEN):
        assert secret not in text, secret
    data = shown.json()["data"]
    assert data["redis_url"].startswith("redis://:***@127.0.0.1:")
    assert data["upstreams"]["exports"]["url"].startswith("http://exports:***@127.0.0.1:")
    assert data["upstreams"]["exports"]["service_token"] == "***"


def test_failed_admin_authentications_are_limited_per_address(services: Callable[..., Service],
                                                              tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        statuses = [client.get("/admin/stats", headers=WRONG).status_code for _ in range(30)]
        refused = statuses.count(401)
        # a burst of 20, plus the few the bucket refilled (5 a second) while the loop ran
        assert 20 <= refused <= 24 and statuses[:20] == [401] * 20 and statuses[-1] == 429, statuses
        limited = client.get("/admin/stats", headers=ADMIN)  # the right token too: no guess goes faster
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json()["data"]["limit"] == "admin_auth"
        # another address has a bucket of its own
        with httpx.Client(base_url=gateway.url, timeout=10,
                          transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
            assert other.get("/admin/stats", headers=ADMIN).status_code == 200
        wait_until(lambda: client.get("/admin/stats", headers=ADMIN).status_code == 200, 5, interval=0.25,
                   what="the address to be let in again")
    text = scrape(gateway)
    assert metric(text, "gateway_admin_auth_failures_total", outcome="refused") == refused
    assert (metric(text, "gateway_admin_auth_failures_total", outcome="limited") or 0) >= 30 - refused + 1


@pytest.mark.inprocess
def test_outside_dev_mode_a_short_admin_token_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "http://127.0.0.1:9", admin_token="short-but-random-Xq9")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"PATH": "/usr/bin:/bin"}
    run = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "gateway", "run", "--config", str(path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "admin_token has 20 characters, fewer than 32" in run.stderr and "GATEWAY_ADMIN_TOKEN" in run.stderr


# -- behind the load balancer of `make cluster` ---------------------------------------------------------------

def test_make_cluster_trusts_its_nginx_and_only_it(tmp_path: Path) -> None:
    env = run_cluster.resolved_env(run_cluster.NODES["g1"], "local")
    written = run_cluster._gateway_config(run_cluster.NODES["g1"], env, "local", tmp_path)
    assert yaml.safe_load(written.read_text())["trusted_proxies"] == ["127.0.0.1/32"]


@pytest.fixture
def nginx_in_front(services: Callable[..., Service], tmp_path: Path) -> Iterator[tuple[str, Service]]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.fail("nginx is not installed (apt-get install nginx-light; make cluster installs it)")
    gateway = services("gateway", gateway_config(
        tmp_path, f"http://127.0.0.1:{free_port()}", trusted_proxies=run_cluster.LB_ADDRESSES["local"],
        address_limit={"per_sec": 0.05, "burst": 4}), ADDRESS_REQUESTS_PER_SEC="0.05", ADDRESS_REQUESTS_BURST="4")
    listen = f"127.0.0.1:{free_port()}"
    workdir = tmp_path / "lb"
    workdir.mkdir()
    conf = run_cluster.nginx_config({"GATEWAYS": gateway.url.removeprefix("http://")}, workdir, listen)
    proc = subprocess.Popen([nginx, "-e", "stderr", "-p", str(workdir), "-c", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: httpx.get(f"http://{listen}/healthz", timeout=1).status_code == 200, 10,
                   what="nginx to answer")
        yield f"http://{listen}", gateway
    finally:
        proc.terminate()
        proc.wait(10)


def _from(address: str) -> httpx.Client:
    return httpx.Client(timeout=10, transport=httpx.HTTPTransport(local_address=address))


def test_behind_the_proxy_each_anonymous_client_has_its_own_bucket(nginx_in_front: tuple[str, Any]) -> None:
    lb, _ = nginx_in_front
    guess = {"Authorization": "Bearer not-a-key"}
    url = f"{lb}/api/v1/exports"
    with _from("127.0.0.2") as first, _from("127.0.0.3") as second:
        # the first client spends its own bucket, whatever it claims to be
        spoofed = guess | {"X-Forwarded-For": "198.51.100.7, 127.0.0.1"}
        statuses = [first.get(url, headers=spoofed).status_code for _ in range(6)]
        assert statuses[:4] == [401] * 4 and statuses[4:] == [429, 429], statuses
        # the second is another client, not the proxy's one shared bucket
        assert [second.get(url, headers=guess).status_code for _ in range(4)] == [401] * 4
        refused = first.get(url, headers=guess)
        assert refused.status_code == 429 and "client address 127.0.0.2 " in refused.json()["message"]
