"""`make run` (`python -m scripts.run_stack`): a taken port or a process that stops fails it loudly, naming what."""
from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.run_stack import StackError, wait_healthy
from tests.procs import ROOT, free_port


class _Healthy(http.server.BaseHTTPRequestHandler):
    """An older instance's /healthz: it answers 200 to anyone."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def old_instance() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _stack(workdir: Path, **ports: int) -> subprocess.Popen[str]:
    ports.setdefault("SLOW_REPORT_PORT", free_port())
    env = dict(os.environ, **{name: str(port) for name, port in ports.items()},
               BACKEND_DATA_DIR=str(workdir / "backend"), GATEWAY_STATE_DIR=str(workdir / "gateway"))
    for name in ("EXPORT_BACKEND_URL", "GATEWAY_PUBLIC_URL", "REDIS_URL", "RESULT_STORE_URL"):
        env.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "scripts.run_stack"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _read_until(stack: subprocess.Popen[str], banner: str) -> None:
    """Read the stack's output up to the line holding `banner`; it must come before the stack exits."""
    assert stack.stdout is not None
    line = "-"
    while line and banner not in line:
        line = stack.stdout.readline()  # an empty line: the stack exited
    assert line, f"the stack exited without its banner: {stack.stderr.read() if stack.stderr else ''}"


@pytest.mark.inprocess
def test_a_taken_port_fails_before_anything_starts_naming_the_port(old_instance: int, tmp_path: Path) -> None:
    stack = _stack(tmp_path, GATEWAY_PORT=old_instance, BACKEND_PORT=free_port())
    out, err = stack.communicate(timeout=30)
    assert stack.returncode == 1
    assert f"gateway port {old_instance} on 127.0.0.1 is already in use" in err
    assert "GATEWAY_PORT=" in err  # what to do about it
    assert "is up" not in out


@pytest.mark.inprocess
def test_a_healthz_answered_by_someone_else_while_the_child_died_is_no_success(old_instance: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(StackError, match="exited while starting \\(exit status 3\\)"):
        wait_healthy("gateway", f"http://127.0.0.1:{old_instance}", child, timeout=10)


def test_up_only_when_up_and_a_stopped_process_fails_the_stack(tmp_path: Path) -> None:
    gateway_port = free_port()
    stack = _stack(tmp_path, GATEWAY_PORT=gateway_port, BACKEND_PORT=free_port())
    try:
        # the banner comes once both answer, or the stack exits
        _read_until(stack, "Export gateway is up")
        children = subprocess.run(["pgrep", "-P", str(stack.pid)], capture_output=True, text=True).stdout.split()
        gateway = [pid for pid in children
                   if f"--port\x00{gateway_port}" in open(f"/proc/{pid}/cmdline").read()]
        assert len(gateway) == 1
        os.kill(int(gateway[0]), signal.SIGKILL)
        _, err = stack.communicate(timeout=30)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    assert stack.returncode == 1
    assert f"gateway at http://127.0.0.1:{gateway_port} stopped (killed by SIGKILL)" in err


def test_ctrl_c_stops_every_process_cleanly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the launcher and its children together: each stops gracefully, once (the
    gateway's change-feed stream to the backend open), without a traceback, and `make run` exits 0."""
    stack = _stack(tmp_path, GATEWAY_PORT=free_port(), BACKEND_PORT=free_port())
    try:
        _read_until(stack, "Ctrl-C stops them all")
        os.killpg(stack.pid, signal.SIGINT)
        out, err = stack.communicate(timeout=60)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    assert stack.returncode == 0, err[-2000:]
    assert "Traceback" not in out + err and "Exception in ASGI application" not in out + err, err[-3000:]
    assert err.count("Finished server process") + out.count("Finished server process") >= 2
