"""`run --workers 2` on Redis: both workers serve, share what must be shared, report and reload as one.

Which worker answers a new connection is the kernel's choice; to aim a request at one
worker, the other is stopped (SIGSTOP) meanwhile: the connection then waits in the
shared accept queue only the running one takes from.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.helpers import wait_status
from tests.procs import ROOT, RedisServer, Service, wait_until
from tests.sse_client import RawStream

pytestmark = pytest.mark.workers

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Stack:
    gateway: Service
    backend: Service

    def workers(self) -> list[int]:
        """The supervisor's worker processes (multiprocessing's spawned children, not its resource tracker)."""
        assert self.gateway.proc is not None
        pid = self.gateway.proc.pid
        children = (int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        return sorted(child for child in children if b"spawn_main" in _cmdline(child))

    @contextlib.contextmanager
    def only(self, worker: int) -> Iterator[None]:
        """Every new connection is served by `worker` meanwhile (the others are stopped)."""
        others = [pid for pid in self.workers() if pid != worker]
        for pid in others:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in others:
                os.kill(pid, signal.SIGCONT)

    def pid_serving(self) -> int:
        return int(httpx.get(f"{self.gateway.url}/admin/stats", headers=ADMIN, timeout=5).json()["data"]["pid"])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # gone meanwhile
        return b""


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], redis_server: RedisServer,
          tmp_path_factory: pytest.TempPathFactory) -> Stack:
    workdir = tmp_path_factory.mktemp("workers")
    backend_settings = backend_config(workdir, redis_server.url, redis_prefix="wk")
    backend_settings["export_types"]["slow_export"] = {"dataset": "orders", "rows": 100, "seed": 3,
                                                       "fault": {"delay_sec": 60}}
    backend = module_services("backend_stub", backend_settings)
    config = gateway_config(workdir, backend.url, redis_server.url, redis_prefix="wk", gateway_processes=2)
    gateway = module_services("gateway", config, "gateway-2w", args=("--workers", "2"))
    s = Stack(gateway, backend)
    wait_until(lambda: len(s.workers()) == 2, 20, what="two worker processes")
    return s


def test_each_worker_serves_on_the_one_port(stack: Stack) -> None:
    for worker in stack.workers():
        with stack.only(worker):
            assert stack.pid_serving() == worker


def test_idempotency_keys_and_the_status_cache_are_shared_by_the_workers(stack: Stack) -> None:
    first, second = stack.workers()
    key = {"Idempotency-Key": f"workers-{time.time_ns()}"}
    body = {"export_type": "report_export"}
    with stack.only(first):
        created = httpx.post(f"{stack.gateway.url}{API}", json=body, headers=AUTH | key, timeout=10)
    with stack.only(second):
        replayed = httpx.post(f"{stack.gateway.url}{API}", json=body, headers=AUTH | key, timeout=10)
    assert created.status_code == replayed.status_code == 202
    assert replayed.headers["idempotent-replayed"] == "true"
    assert replayed.json()["data"]["task_id"] == created.json()["data"]["task_id"]

    task_id = created.json()["data"]["task_id"]
    wait_status(stack.backend.url, task_id, headers={"X-Tenant-Id": "demo"})
    with stack.only(second):
        miss = httpx.get(f"{stack.gateway.url}{API}/{task_id}", headers=AUTH, timeout=10)
    with stack.only(first):
        hit = httpx.get(f"{stack.gateway.url}{API}/{task_id}", headers=AUTH, timeout=10)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("MISS", "HIT")
    assert hit.json() == miss.json()


def _route_requests(text: str, route: str) -> float:
    prefix = f'gateway_requests_total{{route="{route}",status="404"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


def test_metrics_count_every_workers_requests_whichever_is_scraped(stack: Stack) -> None:
    first, second = stack.workers()
    missing = f"{stack.gateway.url}{API}/exp_{'0' * 26}"  # a 404 from the backend, counted on the status route

    def scraped() -> float:
        return _route_requests(httpx.get(f"{stack.gateway.url}/metrics", timeout=5).text, "status")

    before = scraped()
    with stack.only(first):
        for _ in range(3):
            assert httpx.get(missing, headers=AUTH, timeout=10).status_code == 404
    with stack.only(second):
        for _ in range(2):
            assert httpx.get(missing, headers=AUTH, timeout=10).status_code == 404
    # counted in the shared files (prometheus_client multiprocess mode), whichever worker served
    wait_until(lambda: scraped() - before == 5, 10, what="/metrics to count both workers' 5 requests")
    for worker in (first, second):
        with stack.only(worker):
            assert scraped() - before == 5
    gauges = httpx.get(f"{stack.gateway.url}/metrics", timeout=5).text
    assert sum(line.startswith("gateway_config_info{") for line in gauges.splitlines()) == 1


def _headers_request(port: int, count: int) -> bytes:
    """The status line's start of a request with `count` header lines."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(count))
                     + b"\r\n")
        return sock.recv(64)


def test_sighup_to_the_supervisor_replaces_every_worker_with_one_reading_the_config_file(stack: Stack) -> None:
    """uvicorn's supervisor starts new workers on SIGHUP, each serving before the old one stops; they read the
    file then, so even a setting a reload does not apply (the connection limits) takes effect."""
    old = stack.workers()
    config = yaml.safe_load(stack.gateway.config_path.read_text())
    assert _headers_request(stack.gateway.port, 30).startswith(b"HTTP/1.1 200 ")
    config.setdefault("connection_limits", {})["max_headers"] = 20  # below the 30 lines sent (default 100)
    stack.gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    stack.gateway.signal(signal.SIGHUP)

    def replaced() -> list[int] | None:
        now = stack.workers()
        return now if len(now) == 2 and not set(now) & set(old) and stack.workers() == now else None

    new = wait_until(replaced, 60, what="two new workers in place of the old ones")
    for worker in new:
        with stack.only(worker):
            assert stack.pid_serving() == worker
            assert _headers_request(stack.gateway.port, 30).startswith(b"HTTP/1.1 431 ")


def test_a_config_change_reaches_every_worker(stack: Stack) -> None:
    config = yaml.safe_load(stack.gateway.config_path.read_text())
    config["tenants"]["workers_probe"] = {"api_key_hashes": ["sha256:" + "ab" * 32]}
    stack.gateway.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def tenants() -> set[str]:
        return set(httpx.get(f"{stack.gateway.url}/admin/routes", headers=ADMIN, timeout=5).json()["data"]["tenants"])

    for worker in stack.workers():
        with stack.only(worker):
            wait_until(lambda: "workers_probe" in tenants(), 10, what=f"worker {worker} to reload")


def test_connection_limits_hold_in_every_worker(stack: Stack) -> None:
    for worker in stack.workers():
        with stack.only(worker):
            assert _headers_request(stack.gateway.port, 150).startswith(b"HTTP/1.1 431 ")


def _metrics_dir(worker: int) -> Path:
    environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{worker}/environ").read_bytes().split(b"\0") if item)
    return Path(environ[b"PROMETHEUS_MULTIPROC_DIR"].decode())


def test_a_killed_worker_is_replaced_and_the_other_serves_meanwhile(stack: Stack) -> None:
    victim, survivor = stack.workers()
    counted = _route_requests(httpx.get(f"{stack.gateway.url}/metrics", timeout=5).text, "status")
    where = _metrics_dir(victim)
    wait_until(lambda: list(where.glob(f"gauge_live*_{victim}.db")), 10, what="the victim's live gauges")
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{victim}").exists() or "Z" in Path(f"/proc/{victim}/stat").read_text()
               .split(")")[-1].split()[0], 10, what="the killed worker to be gone")
    assert stack.pid_serving() != victim  # the survivor (or already the replacement) answers meanwhile

    def newcomer() -> int | None:
        # /proc's children list is read in pieces and may repeat or skip a pid while a child is reaped or
        # forked: only two equal snapshots with two distinct pids count
        seen = stack.workers()
        fresh = set(seen) - {victim, survivor}
        return fresh.pop() if len(set(seen)) == 2 and len(fresh) == 1 and stack.workers() == seen else None

    replacement = wait_until(newcomer, 15, what="a new worker in place of the killed one")
    with stack.only(replacement):
        wait_until(lambda: stack.pid_serving() == replacement, 15, what="the new worker to serve")
        # the killed worker's counts stay in the totals, whichever worker is scraped
        assert _route_requests(httpx.get(f"{stack.gateway.url}/metrics", timeout=5).text, "status") >= counted
    # its live gauges left the figures at that scrape; its counters stay
    assert not list(where.glob(f"gauge_live*_{victim}.db"))
    assert (where / f"counter_{victim}.db").exists()


def test_sigterm_stops_every_worker_at_once_ending_their_event_streams(
        stack: Stack, services: Callable[..., Service], redis_server: RedisServer, tmp_path: Path) -> None:
    """A graceful stop ends each worker's open event streams with their last chunk, not at the grace period."""
    config = gateway_config(tmp_path, stack.backend.url, redis_server.url, redis_prefix="wk", gateway_processes=2,
                            shutdown_timeout_sec=30)
    gateway = services("gateway", config, "gateway-stop", args=("--workers", "2"))
    task = httpx.post(f"{gateway.url}{API}", json={"export_type": "slow_export"}, headers=AUTH, timeout=10).json()
    streams = [RawStream(gateway.url, f"{API}/{task['data']['task_id']}/events", AUTH) for _ in range(4)]
    try:
        for stream in streams:
            stream.read_until(lambda s: bool(s.events))
        stopping = time.monotonic()
        gateway.signal(signal.SIGTERM)
        assert gateway.proc is not None
        assert gateway.proc.wait(20) == 0
        assert time.monotonic() - stopping < 5, "the event streams held the stop up"
        for stream in streams:
            stream.read_to_end(timeout=5)
            assert stream.ended and not stream.cut, "ended with the body's last chunk"
    finally:
        for stream in streams:
            stream.close()
    assert "Traceback" not in gateway.log()


def test_workers_without_redis_are_refused_with_what_to_set(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_config(tmp_path, "http://127.0.0.1:9")))
    run = subprocess.run([sys.executable, "-m", "gateway", "run", "--config", str(path), "--workers", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert "needs redis_url (REDIS_URL)" in run.stderr


def _run_two_workers(tmp_path: Path, metrics_dir: Path) -> subprocess.CompletedProcess[str]:
    """`run --workers 2` with PROMETHEUS_MULTIPROC_DIR set (on an unreachable Redis: it must stop before serving)."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_config(tmp_path, "http://127.0.0.1:9", "redis://127.0.0.1:9",
                                                  gateway_processes=2)))
    return subprocess.run([sys.executable, "-m", "gateway", "run", "--config", str(path), "--workers", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30,
                          env=os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})


def test_a_metrics_dir_that_is_a_file_is_refused_with_what_to_set(tmp_path: Path) -> None:
    existing = tmp_path / "a-file"
    existing.write_text("kept")
    run = _run_two_workers(tmp_path, existing)
    assert run.returncode == 2
    assert "PROMETHEUS_MULTIPROC_DIR" in run.stderr and "is not a directory" in run.stderr
    assert "Traceback" not in run.stderr
    assert existing.read_text() == "kept"


def test_a_metrics_dir_that_is_a_symlink_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "counter_1.db").write_text("not the gateway's")
    link = tmp_path / "metrics"
    link.symlink_to(target)
    run = _run_two_workers(tmp_path, link)
    assert run.returncode == 2
    assert "is a symbolic link" in run.stderr and "Traceback" not in run.stderr
    assert (target / "counter_1.db").read_text() == "not the gateway's"


def test_a_given_metrics_dir_loses_only_the_files_of_gone_processes(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from exports_common.workers import prepare_metrics_dir

    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process now
    where = tmp_path / "metrics"
    (where / "nested").mkdir(parents=True)
    stale = [where / f"counter_{dead.pid}.db", where / f"gauge_livemax_{dead.pid}.db"]
    kept = [where / f"counter_{os.getpid()}.db",  # a live process's (another run sharing the directory)
            where / "notes.txt", where / "counter.db", where / "nested" / f"counter_{dead.pid}.db"]
    for path in stale + kept:
        path.write_text("x")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(where))
    assert prepare_metrics_dir("gateway") == (where, False)
    assert [p.exists() for p in stale] == [False, False]
    assert all(p.exists() for p in kept)


def test_without_a_metrics_dir_a_private_one_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from exports_common.workers import prepare_metrics_dir

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    where, made = prepare_metrics_dir("gateway")
    try:
        assert made and where.is_dir() and not any(where.iterdir())
        assert where.stat().st_mode & 0o777 == 0o700
    finally:
        where.rmdir()
