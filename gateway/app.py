"""The gateway ASGI app: operations endpoints to Starlette, every other path straight to its route's chain.

The app only routes between the three parts: `wiring` (services, the Runtime in
force, reload), `ops` (operations and admin endpoints) and `dispatch` (a
request through its route's plugin chain).
"""
from __future__ import annotations

import contextlib
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from exports_common.envelope import exception_handlers
from gateway import dispatch
from gateway.config import GatewayConfig
from gateway.ops import OpsEndpoints, is_ops_path
from gateway.wiring import RuntimeHolder, running


class Gateway:
    def __init__(self, config: GatewayConfig, config_path: str | None) -> None:
        self.holder = RuntimeHolder(config, config_path)
        self.ops_app = Starlette(routes=OpsEndpoints(self.holder).routes(), lifespan=self.lifespan,
                                 exception_handlers=exception_handlers())
        # a slash redirect would be built from the client's Host header: a 404 envelope instead
        self.ops_app.router.redirect_slashes = False

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with running(self.holder):
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Public paths go straight to their chain; operations endpoints and lifespan to Starlette.

        Dispatching here rather than through a Starlette catch-all route keeps the
        per-request cost of the hot path to what the chain itself needs.
        """
        if scope["type"] != "http":
            await self.ops_app(scope, receive, send)
            return
        runtime = self.holder.runtime
        if refused := dispatch.refuse_headers(runtime, scope):
            await refused(scope, receive, send)
        elif is_ops_path(scope["path"]):
            await self.ops_app(scope, receive, send)
        else:
            await (await dispatch.handle(runtime, scope, receive))(scope, receive, send)


def create_app(config: GatewayConfig, config_path: str | None = None) -> Gateway:
    return Gateway(config, config_path)
