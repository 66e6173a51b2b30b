import sys
from pathlib import Path

from exports_common.cli import main
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["hash-key"] and len(sys.argv) == 3:
        print(hash_key(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1:2] == ["migrate-config"] and len(sys.argv) == 3:
        sys.exit(migrate_config(sys.argv[2]))
    if sys.argv[1:2] == ["conformance"]:
        sys.exit(conformance.main(sys.argv[2:]))
    if sys.argv[1:] == ["plugins"]:
        # what a route may name here: the built-ins and the installed packages' plugins, each imported and checked
        lines, unusable = registry().describe()
        print("\n".join(lines))
        sys.exit(2 if unusable else 0)
    sys.exit(main("gateway", GatewayConfig, "config/gateway.yaml", create_app, workers_refusal=workers_refusal))
