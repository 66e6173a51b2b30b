import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

from starlette.types import ASGIApp

from backend_stub.app import create_app
from backend_stub.config import BackendConfig
from backend_stub.store import sql_settings
from exports_common.cli import main
from exports_common.sql import SqlError


def make_app(config: BackendConfig, path: str) -> ASGIApp:
    """The app; on a SQL store, first the server's version and the schema (refused: one line, exit 2)."""
    if config.store_kind() == "sql":
        from backend_stub.store.sql_store import check_server

        try:
            # uvicorn loads the app inside its running event loop: the check runs on a loop of its own
            with ThreadPoolExecutor(1, thread_name_prefix="store-check") as apart:
                apart.submit(asyncio.run, check_server(config.database_url, sql_settings(config))).result()
        except SqlError as error:
            print(f"backend_stub: cannot use the task store: {error.message}", file=sys.stderr)
            raise SystemExit(2) from None
    return create_app(config, path)


if __name__ == "__main__":
    sys.exit(main("backend_stub", BackendConfig, "config/backend.yaml", make_app))
