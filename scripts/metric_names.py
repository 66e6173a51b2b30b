"""The metric families each process serves, read from its own /metrics as Prometheus scrapes it.

The only place the reference generator learns metric names: each app is built in this process on the shipped
config (state in a temporary directory, no upstream reachable), scraped once through its ASGI interface and the
text parsed with prometheus_client's parser, so it depends on no metrics module's internals.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp, Message

from exports_common.config_loader import load_model

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Family:
    name: str  # as a query names it: a counter's with `_total`
    type: str
    help: str


@contextmanager
def _isolated() -> Iterator[None]:
    """The shipped configs' state under a temporary directory, their upstream on a port nothing listens on."""
    saved = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(GATEWAY_STATE_DIR=f"{tmp}/gateway", BACKEND_DATA_DIR=f"{tmp}/backend",
                          EXPORT_BACKEND_URL="http://127.0.0.1:9")
        for name in ("REDIS_URL", "RESULT_STORE_URL", "GATEWAY_METRICS_AUTH"):
            os.environ.pop(name, None)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


@asynccontextmanager
async def _lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """The app started and, at the end, stopped as a server would (ASGI lifespan protocol)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()

    async def send(message: Message) -> None:
        await outbox.put(message)

    async def serve() -> None:
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send)

    running = asyncio.create_task(serve())
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started.get('message', started)}")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await running


async def _metrics_text(app: ASGIApp) -> str:
    async with _lifespan(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                 base_url="http://127.0.0.1") as client:
        answer = await client.get("/metrics")
        answer.raise_for_status()
        return answer.text


def _scrape(make_app: Callable[[], ASGIApp]) -> list[Family]:
    with _isolated():
        text = asyncio.run(_metrics_text(make_app()))
    families = list(text_string_to_metric_families(text))
    names = {f.name for f in families}
    return sorted((Family(f.name + ("_total" if f.type == "counter" else ""), f.type, f.documentation)
                   for f in families if not (f.name.endswith("_created") and f.name[:-8] in names)),
                  key=lambda f: f.name)


def _gateway() -> ASGIApp:
    from gateway.app import create_app
    from gateway.config import GatewayConfig

    path = str(ROOT / "config/gateway.yaml")
    return create_app(load_model(path, GatewayConfig), path)


def _backend() -> ASGIApp:
    from backend_stub.app import create_app
    from backend_stub.config import BackendConfig

    return create_app(load_model(ROOT / "config/backend.yaml", BackendConfig))


def gateway_families() -> list[Family]:
    return _scrape(_gateway)


def backend_families() -> list[Family]:
    return _scrape(_backend)
