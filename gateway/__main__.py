import sys

from exports_common.cli import main
from gateway.app import create_app
from gateway.config import GatewayConfig, workers_refusal
from gateway.tenants import hash_key

if __name__ == "__main__":
    if sys.argv[1:2] == ["hash-key"] and len(sys.argv) == 3:
        print(hash_key(sys.argv[2]))
        sys.exit(0)
    sys.exit(main("gateway", GatewayConfig, "config/gateway.yaml", create_app, workers_refusal=workers_refusal))
