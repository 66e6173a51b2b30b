"""The backend trusts only the gateway: a service token on every request, and a named tenant on task endpoints.

With a service token configured (required outside dev mode) every request but the
probes (`/healthz`, `/readyz`) must carry `Authorization: Bearer <token>`; anything
else gets 401. A request to `/exports...` must name its tenant in `X-Tenant-Id` (400
without it), except a file download (`GET|HEAD /exports/{id}/file`), which the gateway
forwards only after it has verified the signed link. `/export-types`, the change feed,
`/metrics` and `/internal/*` take no tenant. The token proves the caller is a gateway;
the tenant header is then the gateway's word for whose request it is.
"""
from __future__ import annotations

import hmac
import re

from starlette.types import ASGIApp, Receive, Scope, Send

from exports_common.envelope import error_response
from exports_common.errors import ApiError, ErrorKind

PROBES = frozenset({"/healthz", "/readyz"})
_FILE = re.compile(r"^/exports/[^/]+/file$")


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


def needs_tenant(method: str, path: str) -> bool:
    """Whether a request must name its tenant: every `/exports...` one but a (signed) file download."""
    if path != "/exports" and not path.startswith("/exports/"):
        return False
    return not (method in ("GET", "HEAD") and _FILE.match(path))


class ServiceAuth:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    def _refusal(self, scope: Scope) -> ApiError | None:
        path = scope["path"]
        if path in PROBES:
            return None
        if self.expected is not None and not hmac.compare_digest(_header(scope, b"authorization") or b"",
                                                                  self.expected):
            return ApiError(ErrorKind.UNAUTHORIZED, "this backend answers only its gateways: send the service "
                            "token as 'Authorization: Bearer <token>' (the gateway's upstream service_token)")
        if needs_tenant(scope["method"], path) and _header(scope, b"x-tenant-id") is None:
            return ApiError(ErrorKind.BAD_REQUEST, "X-Tenant-Id: a request for tasks must name its tenant in this "
                            "header (the gateway sends it)", data={"field": "X-Tenant-Id"})
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
