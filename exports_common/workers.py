"""`run --workers N`: one listening socket, N forked uvicorn servers accepting on it, kept running.

uvicorn's own `--workers` supervisor would take the app and the bounded protocol
class as import strings, but its workers run uvicorn's own `Server`, not
`exports_common.shutdown.Server` (which ends event streams at once on a graceful
stop), and it has no hook to mark a dead worker for prometheus_client's live gauges.
Here each child is forked after the socket is bound, inherits the socket, the app and
the protocol class, and runs `exports_common.shutdown.Server`.

The parent only supervises. SIGTERM / SIGINT stop every worker gracefully (then
kill after the grace period); SIGHUP is passed on to each worker (the gateway
reloads its config on it); a worker that dies unexpectedly is started again,
at most once a second.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from types import FrameType

import uvicorn
from prometheus_client import multiprocess

from exports_common import shutdown

log = logging.getLogger("workers")
# where the workers count their metrics (prometheus_client's multiprocess mode)
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DB_KINDS = frozenset({"counter", "gauge", "histogram", "summary"})
RESTART_DELAY_SEC = 1.0
STARTUP_FAILURE = 3  # uvicorn's exit code when a server could not start (e.g. its lifespan failed)
STOP_GRACE_SEC = 15.0


class MetricsDirRefused(Exception):
    """$PROMETHEUS_MULTIPROC_DIR names something the workers must not count in; the message says what to set."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _left_over(path: Path) -> bool:
    """A file prometheus_client's multiprocess mode wrote (`counter_<pid>.db`, `gauge_livemax_<pid>.db`...) for a
    process that is gone: its counts would be added to this run's."""
    kind, _, rest = path.stem.partition("_")
    pid = rest.rpartition("_")[2]
    return (path.suffix == ".db" and kind in DB_KINDS and pid.isdigit() and not _alive(int(pid))
            and path.is_file() and not path.is_symlink())


def prepare_metrics_dir(prog: str) -> tuple[Path, bool]:
    """The directory this run's workers count in, with no counts of an earlier run; whether it was made here.

    $PROMETHEUS_MULTIPROC_DIR when set: created if missing; a symbolic link or something not a directory is
    refused; only the files prometheus_client wrote there for processes now gone are removed, nothing else and
    nothing below.
    Unset: a private directory of this run (0700 under the temp dir), removed at the end.
    """
    given = os.environ.get(METRICS_DIR_ENV)
    if not given:
        return Path(tempfile.mkdtemp(prefix=f"{prog}-metrics-")), True
    path = Path(given)
    if path.is_symlink():
        raise MetricsDirRefused(f"{METRICS_DIR_ENV}={given} is a symbolic link: set it to a directory itself "
                                f"(or unset it for a private one)")
    if path.exists() and not path.is_dir():
        raise MetricsDirRefused(f"{METRICS_DIR_ENV}={given} is not a directory: set it to a directory the "
                                f"workers may write in (or unset it for a private one)")
    try:
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
        for entry in path.iterdir():
            if _left_over(entry):
                entry.unlink()
    except OSError as exc:
        raise MetricsDirRefused(f"{METRICS_DIR_ENV}={given} cannot be used: {exc.strerror}; set it to a "
                                f"directory the workers may write in (or unset it for a private one)") from exc
    return path, False


class Supervisor:
    def __init__(self, config: uvicorn.Config, workers: int) -> None:
        self.config = config
        self.workers = workers
        self.children: dict[int, float] = {}  # pid -> start time
        self.stopping = False
        self.failed = False
        self.sock: socket.socket | None = None

    def run(self) -> int:
        self.sock = self.config.bind_socket()
        self.sock.set_inheritable(True)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        try:
            for _ in range(self.workers):
                self._spawn()
            log.info("serving with worker processes", extra={"workers": self.workers,
                                                             "pids": sorted(self.children)})
            while self.children:
                self._reap()
                time.sleep(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.sock.close()
        return STARTUP_FAILURE if self.failed else 0

    def _spawn(self) -> None:
        assert self.sock is not None
        pid = os.fork()
        if pid == 0:  # the worker: uvicorn installs its own SIGTERM / SIGINT handling
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            code = STARTUP_FAILURE
            try:
                server = shutdown.Server(self.config)
                server.run(sockets=[self.sock])
                code = 0 if server.started else STARTUP_FAILURE
            finally:
                os._exit(code)
        self.children[pid] = time.monotonic()

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            started = self.children.pop(pid, None)
            if started is None:
                continue
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]  # its gauges leave the figures; its counts stay in the totals
            if self.stopping:
                continue
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == STARTUP_FAILURE:
                # the next would fail the same way: the whole server stops, as a single process would
                log.error("a worker process could not start; stopping", extra={"pid": pid})
                self.failed = True
                self._on_signal(signal.SIGTERM, None)
                return
            log.error("a worker process exited; starting another",
                      extra={"pid": pid, "exit": os.waitstatus_to_exitcode(status)})
            time.sleep(max(0.0, started + RESTART_DELAY_SEC - time.monotonic()))  # no crash loop at full speed
            self._spawn()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._signal_all(signal.SIGHUP)
            return
        if self.stopping:
            return
        self.stopping = True
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SEC
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)

    def _signal_all(self, sig: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                self.children.pop(pid, None)
