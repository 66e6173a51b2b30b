"""The command line both processes share: `run`, `check-config` and `schema`, and any a process adds."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar, cast

import uvicorn
from pydantic import BaseModel
from starlette.types import ASGIApp

from exports_common import dev_mode, jsonlog, shutdown
from exports_common.config_loader import ConfigError, load_model
from exports_common.connection_limits import ConnectionLimits, bounded_http
from exports_common.workers import METRICS_DIR_ENV, STARTUP_FAILURE, Supervisor, metrics_dir

M = TypeVar("M", bound=BaseModel)


class Served(Protocol):
    """What `run` needs of a process's config."""

    host: str
    port: int
    log_level: str
    max_header_bytes: int
    connection_limits: ConnectionLimits
    shutdown_timeout_sec: int

    def unsafe_defaults(self) -> list[str]: ...


class Reloadable(Protocol):
    def restart_required(self, running: Any) -> list[str]: ...


class Warns(Protocol):
    def load_warnings(self) -> list[str]: ...


def load_warnings(config: BaseModel) -> list[str]:
    """What the config should change though it loads (an older shape); a process whose config says none: none."""
    return cast(Warns, config).load_warnings() if hasattr(config, "load_warnings") else []


def _restart_warnings(config: BaseModel, running_path: str, model: type[M]) -> list[str]:
    """A warning for each setting whose change a reload would not apply (a process that has no reload: none)."""
    if not hasattr(config, "restart_required"):
        return []
    running = load_model(running_path, model)
    return [f"{path} changed: it takes effect only at a restart, not on reload"
            for path in cast(Reloadable, config).restart_required(running)]


@dataclass(frozen=True)
class Command:
    """A subcommand of one process's own: its name and help, its arguments, and what it does (the exit code)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], object]  # adds its arguments to the parser given
    run: Callable[[argparse.Namespace], int]


def main(prog: str, model: type[M], default_config: str, make_app: Callable[[M, str], ASGIApp],
         argv: list[str] | None = None, workers_refusal: Callable[[M, int], str | None] | None = None,
         commands: tuple[Command, ...] = ()) -> int:
    """`workers_refusal`: why this config cannot run N worker processes (None: it can); without it, one only.
    `commands`: the process's own subcommands, listed by --help with the shared ones."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="serve, on the config's host and port unless --host or --port say otherwise")
    run.add_argument("--config", default=default_config)
    run.add_argument("--host")
    run.add_argument("--port", type=int)
    if workers_refusal is not None:
        run.add_argument("--workers", type=int, default=1,
                         help="worker processes serving one port (default 1; more need shared state: "
                              "docs/operations/processes.md)")
    run.add_argument("--dev", action="store_true",
                     help=f"dev mode: accept the published demo secrets (same as {dev_mode.DEV_ENV}=1)")
    check = sub.add_parser("check-config", help="validate a config file and name every problem")
    check.add_argument("file")
    check.add_argument("--running", metavar="FILE",
                       help="the config the process started with: warn about settings that a reload to FILE "
                            "would not apply without a restart")
    sub.add_parser("schema", help="print the config's JSON Schema")
    own = {command.name: command for command in commands}
    for command in commands:
        command.arguments(sub.add_parser(command.name, help=command.help, description=command.help))
    args = parser.parse_args(argv)

    if args.command in own:
        return own[args.command].run(args)

    if args.command == "schema":
        print(json.dumps(model.model_json_schema(), indent=2))
        return 0
    path = args.file if args.command == "check-config" else args.config
    try:
        config = load_model(path, model)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    unsafe = cast(Served, config).unsafe_defaults()
    if args.command == "check-config":
        warnings = load_warnings(config) + [f"{problem} (refused at start unless in dev mode)" for problem in unsafe]
        if args.running:
            try:
                warnings += _restart_warnings(config, args.running, model)
            except ConfigError as exc:
                print(exc.report(), file=sys.stderr)
                return 2
        for warning in warnings:
            print(f"{path}: warning: {warning}", file=sys.stderr)
        print(f"{path}: OK" + (f" with {len(warnings)} warning(s)" if warnings else ""))
        return 0
    if args.dev:
        dev_mode.enable_dev_mode()
    if unsafe and not dev_mode.dev_mode():
        print(dev_mode.refusal(unsafe), file=sys.stderr)
        return 2
    workers = getattr(args, "workers", 1)
    refusal = "--workers must be at least 1" if workers < 1 else (
        workers_refusal(config, workers) if workers_refusal is not None and workers > 1 else None)
    if refusal:
        print(f"{prog}: {refusal}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = config.model_copy(update=overrides)
    served = cast(Served, config)
    jsonlog.setup(served.log_level)
    for warning in load_warnings(config):
        logging.getLogger(prog).warning(warning)
    if dev_mode.dev_mode():
        logging.getLogger(prog).warning("DEV MODE: published demo secrets are accepted; never expose this process",
                                        extra={"unsafe": unsafe})
    limits = served.connection_limits
    # proxy_headers off: which forwarding headers to believe is the app's decision (trusted_proxies),
    # not uvicorn's, which believes any from loopback
    server = uvicorn.Config(make_app(config, path), host=served.host, port=served.port, log_config=None,
                            access_log=False, lifespan="on", http=bounded_http(limits, served.max_header_bytes),
                            proxy_headers=False, timeout_keep_alive=limits.keep_alive_sec,
                            timeout_graceful_shutdown=served.shutdown_timeout_sec)
    if workers == 1:
        os.environ.pop(METRICS_DIR_ENV, None)  # one process answers for itself: no other run's files merged in
        single = shutdown.Server(server)
        # uvicorn re-raises the Ctrl-C it shut down on; a stop asked for is no error (uvicorn.run swallows it too)
        with contextlib.suppress(KeyboardInterrupt):
            single.run()
        return 0 if single.started else STARTUP_FAILURE
    with metrics_dir(Path(tempfile.gettempdir()) / f"{prog}-metrics-{os.getpid()}"):
        return Supervisor(server, workers).run()
