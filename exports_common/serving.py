"""What a serving process loads: its config file, read by the process that serves.

`ServedConfig` is uvicorn's `Config` whose app, bounded protocol and timeouts come from
the config file when uvicorn loads it, in the process that serves: the one process of
`run`, or each worker of `run --workers N` at its start (uvicorn starts its workers with
multiprocessing's spawn, so what crosses to a worker is only `Source`, which pickles: the
model, the file's path, the command line's overrides and the app's factory). A worker
started again (SIGHUP to the supervisor, or in place of one that died) reads the file as
it is then.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast

import uvicorn
from pydantic import BaseModel
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE

from exports_common import jsonlog
from exports_common.config_loader import ConfigError, load_model
from exports_common.connection_limits import ConnectionLimits, bounded_http


class Served(Protocol):
    """What `run` needs of a process's config."""

    host: str
    port: int
    log_level: str
    max_header_bytes: int
    connection_limits: ConnectionLimits
    shutdown_timeout_sec: int

    def unsafe_defaults(self) -> list[str]: ...


@dataclass(frozen=True)
class Source:
    """Where a serving process reads its config, and what makes its app from it."""

    model: type[BaseModel]
    path: str
    overrides: dict[str, Any]  # the command line's --host / --port
    make_app: Callable[[Any, str], ASGIApp]

    def read(self) -> BaseModel:
        return load_model(self.path, self.model).model_copy(update=self.overrides)


class ServedConfig(uvicorn.Config):
    def __init__(self, source: Source, served: Served, workers: int, worker_start_sec: int) -> None:
        """`served`: the config as `run` read it, for what the listening socket needs (host and port);
        `worker_start_sec`: how long a worker may take to start, and to answer the supervisor's health check."""
        # no app yet: load() makes it from the config file it reads. proxy_headers off: which forwarding
        # headers to believe is the app's decision (trusted_proxies), not uvicorn's, which believes any from loopback.
        # server_header off: answers do not name the server software (and its version) to whoever asks
        super().__init__("", factory=True, host=served.host, port=served.port, workers=workers, log_config=None,
                         access_log=False, lifespan="on", proxy_headers=False, server_header=False,
                         timeout_worker_healthcheck=worker_start_sec)
        self.source = source

    def load(self) -> None:
        """Reads the config file, then lets uvicorn load the app made from it and the protocol bounded by it."""
        try:
            config = self.source.read()
        except ConfigError as exc:  # the file changed since `run` checked it: this process cannot start
            print(exc.report(), file=sys.stderr)
            sys.exit(STARTUP_FAILURE)
        served = cast(Served, config)
        jsonlog.setup(served.log_level)
        limits = served.connection_limits
        self.http = bounded_http(limits, served.max_header_bytes)
        self.timeout_keep_alive = limits.keep_alive_sec
        self.timeout_graceful_shutdown = served.shutdown_timeout_sec
        self.app = lambda: self.source.make_app(config, self.source.path)
        super().load()
