"""The backend ASGI app: API, workers and janitor share one store for the process's lifetime."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette

from backend_stub import janitor
from backend_stub.api import BackendApi
from backend_stub.callbacks import CallbackSender
from backend_stub.config import BackendConfig
from backend_stub.files import ResultFiles
from backend_stub.http_fault import HttpFault, RequestCounter
from backend_stub.result_store import open_result_store
from backend_stub.store import open_store
from backend_stub.worker import Workers
from exports_common.envelope import exception_handlers


def create_app(config: BackendConfig) -> HttpFault:
    store = open_store(config)
    files = ResultFiles(config.data_dir)
    results = open_result_store(config.result_store, config.data_dir)
    workers = Workers(config, store, files, results)
    sender = CallbackSender(config, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await store.open()
        await workers.start()
        sweeper = asyncio.create_task(janitor.run(store, results, config.sweep_interval_sec))
        callbacks = asyncio.create_task(sender.run())
        try:
            yield
        finally:
            sweeper.cancel()
            callbacks.cancel()
            await workers.stop()
            await store.close()

    counter = RequestCounter()
    api = BackendApi(config, store, files, results, counter)
    app = Starlette(routes=api.routes(), lifespan=lifespan, exception_handlers=exception_handlers())
    return HttpFault(app, config.http_fault, counter)
