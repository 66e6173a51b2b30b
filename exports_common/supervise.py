"""Child processes of the local launchers (`make run`, `make cluster`): wait for one to exit, stop them all."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence

Processes = Sequence["subprocess.Popen[bytes]"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM stops the launcher as Ctrl-C does, so its children are stopped too."""
    signal.signal(signal.SIGTERM, _interrupt)


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
