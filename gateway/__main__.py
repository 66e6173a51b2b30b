import argparse
import sys
from pathlib import Path

from exports_common.cli import Command, main
from exports_common.config_loader import ConfigError, load_model
from gateway import conformance
from gateway.app import create_app
from gateway.config import GatewayConfig, workers_refusal
from gateway.legacy_config import migrated
from gateway.plugin_registry import registry
from gateway.tenants import hash_key


def migrate_config(path: str) -> int:
    """Print the config file at `path` in the current shape (it must load as it is: problems are listed)."""
    try:
        config = load_model(path, GatewayConfig)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    text = Path(path).read_text()
    if not config.load_warnings():
        print(f"{path}: already in the current shape", file=sys.stderr)
        print(text, end="")
        return 0
    print(migrated(text), end="")
    return 0


def list_plugins(_args: argparse.Namespace) -> int:
    """What a route may name here: the built-ins and the installed packages' plugins, each imported and checked."""
    lines, unusable = registry().describe()
    print("\n".join(lines))
    return 2 if unusable else 0


def print_key_hash(args: argparse.Namespace) -> int:
    print(hash_key(args.key))
    return 0


COMMANDS = (
    Command("plugins", "list the plugins a route may name (built-in and installed), each checked; "
            "exit 2 when one cannot be used",
            lambda parser: None, list_plugins),
    Command("hash-key", "print the hash of an API key, for a tenant's api_key_hashes",
            lambda parser: parser.add_argument("key", help="the API key (one starting with '-': put -- before it)"),
            print_key_hash),
    Command("migrate-config", "print a config file in the current shape (it must load as it is)",
            lambda parser: parser.add_argument("file"), lambda args: migrate_config(args.file)),
    Command("conformance", "check that a backend speaks the upstream task contract the gateway relies on; "
            "exit 0 only when every required check passes", conformance.add_arguments, conformance.run_checks),
)


def cli(argv: list[str] | None = None) -> int:
    return main("gateway", GatewayConfig, "config/gateway.yaml", create_app, argv, workers_refusal=workers_refusal,
                commands=COMMANDS)


if __name__ == "__main__":
    sys.exit(cli())
