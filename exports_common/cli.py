"""The command line both processes share: `run`, `check-config` and `schema`, and any a process adds."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar, cast

import uvicorn
from pydantic import BaseModel
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE

from exports_common import dev_mode, jsonlog
from exports_common import workers as worker_processes
from exports_common.config_loader import ConfigError, load_model
from exports_common.serving import Served, ServedConfig, Source
from exports_common.workers import METRICS_DIR_ENV, MetricsDirRefused, prepare_metrics_dir

# how long a worker of `run --workers N` may take to start serving (a SIGHUP keeps the old one when the new one
# is not serving by then), and to answer the supervisor's health check (else it is killed and started again)
WORKER_START_SEC = 30

M = TypeVar("M", bound=BaseModel)


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
    if workers == 1 and METRICS_DIR_ENV in os.environ:
        # prometheus_client chose its multiprocess mode when it was imported, from $PROMETHEUS_MULTIPROC_DIR:
        # one process answers for itself, so the run starts again (the same process, exec) without it
        os.environ.pop(METRICS_DIR_ENV)
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    made = False
    if workers > 1:  # the workers, started afresh, take the variable from this process's environment
        try:
            where, made = prepare_metrics_dir(prog)
        except MetricsDirRefused as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        os.environ[METRICS_DIR_ENV] = str(where)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = config.model_copy(update=overrides)
    served = cast(Served, config)
    jsonlog.setup(served.log_level)
    for warning in load_warnings(config):
        logging.getLogger(prog).warning(warning)
    if dev_mode.dev_mode():
        logging.getLogger(prog).warning("DEV MODE: published demo secrets are accepted; never expose this process",
                                        extra={"unsafe": unsafe})
    server = ServedConfig(Source(model, path, overrides, make_app), served, workers, WORKER_START_SEC)
    if workers == 1:
        single = uvicorn.Server(server)
        # uvicorn re-raises the Ctrl-C it shut down on; a stop asked for is no error (uvicorn.run swallows it too)
        with contextlib.suppress(KeyboardInterrupt):
            single.run()
        return 0 if single.started else STARTUP_FAILURE
    try:
        return worker_processes.serve(server)
    finally:
        if made:
            shutil.rmtree(os.environ[METRICS_DIR_ENV], ignore_errors=True)
