"""Starting the processes a benchmark measures, with the same helpers the tests use."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

from benchmarks import wrk
from tests.conftest import DEMO_KEY, RAISED_LIMITS
from tests.procs import ROOT, Service, free_port, wait_until

AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}


class Processes:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Service] = []

    def start(self, module: str, config: dict[str, Any], name: str, root: Path | None = None,
              env: dict[str, str] | None = None, args: tuple[str, ...] = (), timeout: float = 20.0) -> Service:
        if module == "gateway":
            env = RAISED_LIMITS | (env or {})
        service = Service(module, config, self.workdir, name, root=root or ROOT, env=env, args=args).start(timeout)
        self.started.append(service)
        return service

    def stop_all(self) -> None:
        for service in reversed(self.started):
            service.stop()


SERVER_CPU, LOAD_CPU = 0, (os.cpu_count() or 1) - 1


def pin(service: Service, cpus: set[int] | None = None) -> None:
    """Keep a measured server on SERVER_CPU (or `cpus`); pass `cpu=LOAD_CPU` to wrk.run for the load.

    On two cores, a server and wrk left to the scheduler sometimes share one core
    for a whole run and sometimes do not; a comparison then measures where they landed.
    """
    assert service.proc is not None
    os.sched_setaffinity(service.proc.pid, cpus if cpus is not None else {SERVER_CPU})


def unpin(service: Service) -> None:
    pin(service, set(range(os.cpu_count() or 1)))


@contextlib.contextmanager
def processes() -> Iterator[Processes]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        procs = Processes(Path(tmp))
        try:
            yield procs
        finally:
            procs.stop_all()


def submit_and_wait(gateway_url: str, body: dict[str, Any], statuses: set[str], timeout: float = 120) -> str:
    task_id = httpx.post(f"{gateway_url}/api/v1/exports", json=body, headers=AUTH, timeout=30).json()["data"]["task_id"]

    def reached() -> bool:
        data = httpx.get(f"{gateway_url}/api/v1/exports/{task_id}", headers=AUTH, timeout=30).json()["data"]
        return data["status"] in statuses

    wait_until(reached, timeout, interval=0.1, what=f"{task_id} to reach {statuses}")
    return task_id


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and of its children alive now (nginx's workers), from /proc."""
    pids = [pid, *(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    ticks = 0
    for one in pids:
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime and stime (fields 14 and 15 of proc(5))
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_per_request(pid: int, url: str, seconds: float, headers: dict[str, str], connections: int = 32,
                    cpu: int | None = None) -> tuple[float, wrk.WrkResult]:
    """One wrk run against `url` and the CPU µs per request it cost process `pid` (user + sys, its children's
    too), with wrk's figures; `cpu`: wrk on that core alone."""
    before = cpu_seconds(pid)
    result = wrk.run(url, seconds=seconds, connections=connections, headers=headers, cpu=cpu)
    return (cpu_seconds(pid) - before) / max(1, result.requests) * 1e6, result


@dataclass(frozen=True)
class Nginx:
    url: str
    pid: int  # the master; its worker is its child


@contextlib.contextmanager
def nginx(upstream: str, body_file: Path, static_everywhere: bool = False) -> Iterator[Nginx | None]:
    """nginx on a free port: /static answers `body_file`, everything else is proxy_pass to `upstream`.

    `static_everywhere`: every path answers `body_file` (a static upstream, no proxying).
    None when nginx is not installed (the comparison is then skipped).
    """
    binary = shutil.which("nginx")
    if binary is None:
        yield None
        return
    port = free_port()
    host_port = upstream.split("://", 1)[1]
    body = body_file.read_text()
    if "'" in body:
        raise ValueError("the static answer must not contain a single quote (nginx string)")
    rest = ("location / { default_type application/json; return 200 '" + body + "'; }" if static_everywhere
            else 'location / { proxy_pass http://pool; proxy_http_version 1.1; proxy_set_header Connection ""; }')
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(f"""
worker_processes 1; daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp};
  scgi_temp_path {tmp};
  upstream pool {{ server {host_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location = /static {{ default_type application/json; return 200 '{body}'; }}
    {rest}
  }}
}}""")
        proc = subprocess.Popen([binary, "-c", str(conf), "-p", tmp], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/static", timeout=1).status_code == 200, 10,
                       what="nginx")
            yield Nginx(f"http://127.0.0.1:{port}", proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
