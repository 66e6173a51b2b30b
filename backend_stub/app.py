"""The backend ASGI app: API, workers and janitor share one store for the process's lifetime."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from backend_stub import janitor, metrics, tracing
from backend_stub.admin_api import AdminApi
from backend_stub.api import BackendApi
from backend_stub.callbacks import CallbackSender
from backend_stub.change_feed import ChangeFeed
from backend_stub.config import BackendConfig
from backend_stub.disk_space import DiskSpace
from backend_stub.files import ResultFiles
from backend_stub.http_fault import HttpFault, RequestCounter
from backend_stub.registry import Registry
from backend_stub.reload import ConfigReloader, Reload
from backend_stub.result_store import open_result_store
from backend_stub.service_auth import ServiceAuth
from backend_stub.store import open_store
from backend_stub.worker import Workers
from exports_common import otel
from exports_common.envelope import error_response, exception_handlers, ok
from exports_common.errors import unavailable
from exports_common.periodic import running
from exports_common.redis_client import RETRY_AFTER_SEC, store_unavailable
from exports_common.sql import SqlError

log = logging.getLogger("backend.app")


def create_app(config: BackendConfig, config_path: str | None = None) -> ASGIApp:
    """The app for `config`; with `config_path`, its export types and callback allow-list follow that file (reloaded
    on change, SIGHUP and POST /internal/reload)."""
    tracing.setup(config.tracing)
    store = open_store(config)
    registry = Registry(config, config_path, store)
    files = ResultFiles(config.data_dir)
    results = open_result_store(config.result_store, config.data_dir, config.download_redirect.public_endpoint)
    disk = DiskSpace(config.data_dir, config.min_free_bytes)
    workers = Workers(config, registry, store, files, results, disk)
    sender = CallbackSender(config, store)
    registry.on_change(sender.apply)
    reloader = ConfigReloader(registry)
    reloads: set[asyncio.Task[Reload]] = set()  # held until done: the loop keeps tasks weakly

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await store.open()
        await workers.start()
        reloader.arm_sighup(reloads)
        try:
            async with running(janitor.run(store, results, config.sweep_interval_sec), sender.run(),
                               reloader.watch()):
                yield
        finally:
            await workers.stop()
            await store.close()
            otel.shutdown()

    async def readyz(request: Request) -> Response:
        """Ready when the store answers and data_dir has room for exports (/healthz: alive)."""
        try:
            await asyncio.wait_for(store.ping(), 2.0)
        except (TimeoutError, RedisError, SqlError, OSError) as exc:
            return error_response(unavailable(f"not ready: the store does not answer ({type(exc).__name__})", 2))
        short = disk.shortage()
        if short is not None:
            return error_response(unavailable(f"not ready: {short}; no task is claimed until space is back", 30,
                                              data={"reason": "disk_full"}))
        return ok({"status": "ready"})

    async def redis_failed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RedisError)
        return error_response(store_unavailable(exc))

    async def sql_failed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SqlError)
        log.warning("the task store failed under a request", extra={"error": exc.message})
        return error_response(unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                                          data={"reason": "store_unavailable"}))

    counter = RequestCounter()
    api = BackendApi(config, registry, store, files, results, counter)
    metrics.seed(config.export_types, config.workers)
    routes = [*api.routes(), *AdminApi(store).routes(), *reloader.routes(),
              Route("/metrics", metrics.endpoint(store), methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
    if config.change_log.feed:  # without it, a gateway's 404 makes it poll each watched task instead
        routes.append(Route("/events", ChangeFeed(store, config.change_log).events, methods=["GET"]))
    handlers = {**exception_handlers(), RedisError: redis_failed, SqlError: sql_failed}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    # the service token checked first: a caller without it makes no span (the probes, open to all, make theirs)
    return ServiceAuth(tracing.instrumented(HttpFault(app, config.http_fault, counter), routes),
                       config.required_token())
