"""auth: an API key (`Authorization: Bearer <key>`) names the tenant; the tenant goes upstream.

The tenant header the upstream trusts is only ever set here: the proxy drops any
`X-Tenant-Id` a client sends.
"""
from __future__ import annotations

from typing import Awaitable, ClassVar

from exports_common.errors import ApiError, ErrorKind
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Gatekeeper, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="exports"'}


class AuthSettings(Settings):
    required: bool = True


class Auth(Gatekeeper[AuthSettings]):
    name: ClassVar[str] = "auth"
    Settings: ClassVar[type[AuthSettings]] = AuthSettings
    provides: ClassVar[frozenset[str]] = frozenset({"tenant"})

    def __init__(self, next: Handler, settings: AuthSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.required = settings.required

    def admit(self, ctx: RequestContext) -> Awaitable[GatewayResponse] | None:
        # the tenant first: rate_limit has usually resolved it, and a valid key needs no second header lookup
        tenant = self.services.tenants.caller(ctx)
        if tenant is None:
            if b"authorization" in ctx.header_values:
                raise ApiError(ErrorKind.UNAUTHORIZED, "the API key is not valid", headers=_CHALLENGE)
            if self.required:
                raise ApiError(ErrorKind.UNAUTHORIZED, headers=_CHALLENGE)
            return None
        ctx.tenant = tenant
        ctx.upstream_headers["x-tenant-id"] = tenant
        return None
