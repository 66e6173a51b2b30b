"""Child processes of the local launchers (`make run`, `make cluster`): wait, restart, stop them all."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Processes = Sequence["subprocess.Popen[bytes]"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM stops the launcher as Ctrl-C does, so its children are stopped too; and Ctrl-C (SIGINT) does,
    even when the launcher was started in the background of a shell, which ignores it there."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_for_any_exit(started: Processes) -> None:
    while all(p.poll() is None for p in started):
        time.sleep(0.5)


def stop_all(started: Processes, sig: int = signal.SIGTERM, grace_sec: float = 10.0) -> None:
    """Signal every child still running, newest first, then kill any that outlives the grace period."""
    for proc in reversed(started):
        if proc.poll() is None:
            proc.send_signal(sig)
    for proc in reversed(started):
        try:
            proc.wait(grace_sec)
        except subprocess.TimeoutExpired:
            proc.kill()


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class Child:
    """One supervised process: how to start it, how to tell it serves, what to do each time it does."""

    name: str
    start: Callable[[], subprocess.Popen[bytes]]
    ready: Callable[[], bool]
    on_ready: Callable[[], None] | None = None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)
    backoff_sec: float = 0.0
    restart_at: float | None = None  # set while it is down and waiting for its backoff
    awaiting_ready: bool = False


class Supervisor:
    """Keeps every child running until it is told to stop: one that exits is started again, alone.

    The wait before a restart starts at `initial_sec` and doubles on each quick exit up to
    `max_sec`; a child that ran `stable_sec` or longer before exiting starts over at `initial_sec`.
    `report` is told each exit, restart and return to service, naming the child.
    """

    def __init__(self, report: Callable[[str], None], initial_sec: float = 1.0, max_sec: float = 30.0,
                 stable_sec: float = 60.0) -> None:
        self.report = report
        self.initial_sec = initial_sec
        self.max_sec = max_sec
        self.stable_sec = stable_sec
        self.children: list[Child] = []

    def adopt(self, child: Child, proc: subprocess.Popen[bytes]) -> None:
        """Supervise `child`, already started as `proc` and serving."""
        child.proc, child.started_at, child.backoff_sec = proc, time.monotonic(), self.initial_sec
        self.children.append(child)

    def stop(self, grace_sec: float = 10.0) -> None:
        """Stop every child, the last started first, each once the one after it has exited: a node is stopped
        while the nodes it needs still serve its last requests and its shutdown."""
        for child in reversed(self.children):
            if child.proc is not None:
                stop_all([child.proc], grace_sec=grace_sec)

    def run(self, poll_sec: float = 0.2) -> None:
        """Supervise until interrupted (Ctrl-C, or SIGTERM after stop_on_sigterm)."""
        while True:
            self.tick()
            time.sleep(poll_sec)

    def tick(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child, now)
            elif child.proc is not None and child.proc.poll() is not None:
                self._exited(child, child.proc.returncode, now)
            elif child.awaiting_ready:
                self._check_ready(child)

    def _exited(self, child: Child, returncode: int, now: float) -> None:
        if now - child.started_at >= self.stable_sec:
            child.backoff_sec = self.initial_sec
        delay = child.backoff_sec
        child.backoff_sec = min(self.max_sec, delay * 2)
        child.restart_at = now + delay
        child.awaiting_ready = False
        self.report(f"{child.name} exited ({exit_reason(returncode)}); restarting it in {delay:g} s")

    def _restart(self, child: Child, now: float) -> None:
        child.restart_at = None
        child.restarts += 1
        child.started_at = now
        try:
            child.proc = child.start()
        except OSError as exc:
            self.report(f"{child.name} could not be started ({exc})")
            self._exited(child, 127, now)
            return
        child.awaiting_ready = True
        self.report(f"{child.name} restarted (restart {child.restarts}, pid {child.proc.pid})")

    def _check_ready(self, child: Child) -> None:
        try:
            if not child.ready():
                return
            if child.on_ready is not None:
                child.on_ready()
        except Exception:  # noqa: BLE001 - a node coming up refuses or resets connections in many ways
            return
        child.awaiting_ready = False
        self.report(f"{child.name} is serving again (restart {child.restarts})")
