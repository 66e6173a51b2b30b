"""The command line of the tests' stand-in servers, as tests/procs.Service starts them:
`python -m tests.<module> run --config FILE`, the file a YAML mapping holding at least `port`."""
from __future__ import annotations

import argparse
from typing import Any

import uvicorn
import yaml


def config_from_args() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as file:
        config: dict[str, Any] = yaml.safe_load(file)
    return config


def serve(app: Any, config: dict[str, Any]) -> None:
    """`app` on loopback at the config's port until the process is stopped."""
    uvicorn.run(app, host="127.0.0.1", port=config["port"], log_level="warning")
