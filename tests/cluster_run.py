"""`make cluster` itself (`python -m scripts.run_cluster up`) as a process of a test or of the chaos tool.

Its ports are shifted (CLUSTER_PORT_OFFSET) into a range no other test uses: each pytest-xdist
worker starts from an offset of its own, below the workers' port blocks and the ephemeral range.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scripts import run_cluster
from tests.procs import ROOT, wait_until

# each shifts the topology's ports (16379-19000) to somewhere in 7379-15000, clear of the machine's own
# servers (3306, 4222, 5432, 5672, 6379, 8080-8082) and of the xdist workers' blocks (20000 and up)
OFFSETS = (-9000, -8000, -7000, -6000, -5000, -4000)
READY_LINE = "Ctrl-C stops them all"


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no use
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_offset() -> int:
    """A shift of the topology's ports that leaves every one of them free here, this xdist worker's first."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = int(worker[2:]) if worker.startswith("gw") else 0
    for i in range(len(OFFSETS)):
        offset = OFFSETS[(start + i) % len(OFFSETS)]
        if all(_free(node.port + offset) for node in run_cluster.TOPOLOGY):
            return offset
    raise AssertionError("no free port range for the cluster")


class RunningCluster:
    """`python -m scripts.run_cluster up` on shifted ports, its data, logs and pid files under `data_dir`."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        """`args`: more of `up`'s options (--store postgresql --database-url URL)."""
        self.data_dir = data_dir
        self.args = args
        self.offset = free_offset()
        self.env = dict(os.environ, CLUSTER_PORT_OFFSET=str(self.offset), CLUSTER_DATA_DIR=str(data_dir),
                        **(env or {}))
        self.output_path = data_dir / "cluster.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> RunningCluster:
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "scripts.run_cluster", "up", *self.args], cwd=ROOT,
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_until(self._up, timeout, interval=0.3, what=f"the cluster to start; its output: {self.output_path}")
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"make cluster exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        return READY_LINE in self.output()

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""

    def port(self, name: str) -> int:
        return run_cluster.NODES[name].port + self.offset

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port(name)}"

    @property
    def lb(self) -> str:
        return self.url("lb")

    def pid(self, name: str) -> int:
        return int((self.data_dir / f"{name}.pid").read_text())

    def signal(self, name: str, sig: int) -> int:
        """Send `sig` to node `name` (a process this cluster started); its pid."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def log(self, name: str) -> str:
        path = self.data_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_serving(self, name: str, restarts: int, timeout: float = 60.0) -> None:
        """Until the supervisor said node `name` serves again after its `restarts`-th restart."""
        wait_until(lambda: f"{name} is serving again (restart {restarts})" in self.output(), timeout, interval=0.2,
                   what=f"{name} to serve again after restart {restarts}")

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; its exit status, once every node's port is closed."""
        if self.proc is None:
            return 0
        for name in ("g1", "g2", "b1", "b2", "s3", "redis", "lb"):  # none may stay frozen by a test
            try:
                self.signal(name, signal.SIGCONT)
            except (OSError, ValueError):
                pass
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(listening(self.port(n.name)) for n in run_cluster.TOPOLOGY):
            time.sleep(0.2)
        return self.proc.returncode
