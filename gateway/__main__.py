import sys

from exports_common.cli import main
from gateway.app import create_app
from gateway.config import GatewayConfig, workers_refusal
from gateway.plugin_registry import registry
from gateway.tenants import hash_key

if __name__ == "__main__":
    if sys.argv[1:2] == ["hash-key"] and len(sys.argv) == 3:
        print(hash_key(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1:] == ["plugins"]:
        # what a route may name here: the built-ins and the installed packages' plugins, each imported and checked
        lines, unusable = registry().describe()
        print("\n".join(lines))
        sys.exit(2 if unusable else 0)
    sys.exit(main("gateway", GatewayConfig, "config/gateway.yaml", create_app, workers_refusal=workers_refusal))
