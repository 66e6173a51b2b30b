import sys

from backend_stub.app import create_app
from backend_stub.config import BackendConfig
from exports_common.cli import main

if __name__ == "__main__":
    sys.exit(main("backend_stub", BackendConfig, "config/backend.yaml", create_app))
