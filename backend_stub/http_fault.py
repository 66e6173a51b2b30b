"""ASGI middleware that fails a share of API requests on purpose, and counts every request.

`tenants` narrows the fault to some tenants' requests, so a test can make the
upstream fail for one tenant only (as a tenant's bad input would).

The count (served on /healthz) lets resilience tests measure how many calls the
gateway really made, from the receiving side.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from backend_stub.config import HttpFaultConfig
from exports_common.envelope import error_response
from exports_common.errors import ApiError, ErrorKind


@dataclass
class RequestCounter:
    requests: int = 0


class HttpFault:
    def __init__(self, app: ASGIApp, config: HttpFaultConfig, counter: RequestCounter) -> None:
        self.app = app
        self.config = config
        self.counter = counter
        self.tenants = frozenset(config.tenants)

    def _targets(self, scope: Scope) -> bool:
        if not self.tenants:
            return True
        tenant = next((v for k, v in scope["headers"] if k == b"x-tenant-id"), b"")
        return tenant.decode("latin-1") in self.tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.config.path_prefix):
            self.counter.requests += 1
            if random.random() < self.config.error_rate and self._targets(scope):
                err = ApiError(ErrorKind.UNAVAILABLE, "fault injected by the backend's http_fault setting",
                               headers={"Retry-After": "1"})
                response = error_response(err)
                response.status_code = self.config.status
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
