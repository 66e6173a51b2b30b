"""`run --workers N`: uvicorn's supervisor, and the directory its workers count their metrics in.

uvicorn's `Multiprocess` binds the socket, starts the workers (multiprocessing spawn:
each reads the config file itself, `exports_common.serving`), starts one again in place
of one that dies, stops them all gracefully on SIGTERM / SIGINT, and on SIGHUP replaces
them one by one, each new one serving before the old one stops (so an edited config
file takes effect whole). A worker that cannot start stops the whole server, as a single
process would.

The workers count in prometheus_client's multiprocess mode, in files under
$PROMETHEUS_MULTIPROC_DIR, so whichever worker is scraped answers for all of them.
A worker that is gone keeps its counts in the totals; its live gauges leave the
figures at the next scrape (`forget_gone`: uvicorn's supervisor has no hook for a
worker's end).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from prometheus_client import multiprocess
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from exports_common.serving import ServedConfig

# where the workers count their metrics (prometheus_client's multiprocess mode)
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DB_KINDS = frozenset({"counter", "gauge", "histogram", "summary"})


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


def _writer(path: Path) -> int | None:
    """The pid of the process that wrote this prometheus_client file (`counter_<pid>.db`,
    `gauge_livemax_<pid>.db`...); None for any other file."""
    kind, _, rest = path.stem.partition("_")
    pid = rest.rpartition("_")[2]
    return int(pid) if path.suffix == ".db" and kind in DB_KINDS and pid.isdigit() else None


def _left_over(path: Path) -> bool:
    """A file prometheus_client's multiprocess mode wrote for a process that is gone: its counts would be added
    to this run's."""
    pid = _writer(path)
    return pid is not None and not _alive(pid) and path.is_file() and not path.is_symlink()


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


def forget_gone(where: str) -> None:
    """The live gauges of every worker now gone leave the figures; their counters stay in the totals."""
    gone = {pid for entry in Path(where).glob("gauge_live*_*.db")
            if (pid := _writer(entry)) is not None and not _alive(pid)}
    for pid in gone:
        with contextlib.suppress(FileNotFoundError):  # another worker's scrape removed it meanwhile
            multiprocess.mark_process_dead(pid, where)  # type: ignore[no-untyped-call]  # untyped in prometheus_client


def serve(config: ServedConfig) -> int:
    """Serves with `config.workers` processes until SIGTERM / SIGINT; the exit code (3: a worker could not
    start)."""
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    return STARTUP_FAILURE if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0
