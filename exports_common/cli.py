"""The command line both processes share: `run`, `check-config` and `schema`."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, TypeVar

import uvicorn
from pydantic import BaseModel
from starlette.types import ASGIApp

from exports_common import jsonlog
from exports_common.config_loader import ConfigError, load_model

M = TypeVar("M", bound=BaseModel)


def main(prog: str, model: type[M], default_config: str, make_app: Callable[[M, str], ASGIApp],
         argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve")
    run.add_argument("--config", default=default_config)
    run.add_argument("--host")
    run.add_argument("--port", type=int)
    check = sub.add_parser("check-config", help="validate a config file and name every problem")
    check.add_argument("file")
    sub.add_parser("schema", help="print the config's JSON Schema")
    args = parser.parse_args(argv)

    if args.command == "schema":
        print(json.dumps(model.model_json_schema(), indent=2))
        return 0
    path = args.file if args.command == "check-config" else args.config
    try:
        config = load_model(path, model)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    if args.command == "check-config":
        print(f"{path}: OK")
        return 0
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = config.model_copy(update=overrides)
    server = config.model_dump(include={"host", "port", "log_level"})
    jsonlog.setup(server.get("log_level", "info"))
    uvicorn.run(make_app(config, path), host=server["host"], port=server["port"], log_config=None,
                access_log=False, lifespan="on")
    return 0
