"""tenant_allowlist: a route open only to the tenants it lists.

A backend team exposing an endpoint to some customers only (a beta, a paid
export type) lists them on the route:

    plugins:
      - auth
      - tenant_allowlist: {tenants: [acme, globex]}

Any other tenant gets the same 404 as a path with no route at all, so a tenant
cannot tell which routes exist for others; a request without an API key (auth
with `required: false`) gets 401. Each refusal is logged with the route and the
tenant, for the operator.
"""
from __future__ import annotations

import logging
from typing import ClassVar

from pydantic import Field

from exports_common.errors import ApiError, ErrorKind
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

log = logging.getLogger("tenant_allowlist")


class TenantAllowlistSettings(Settings):
    tenants: list[str] = Field(min_length=1, description="the tenants (names under `tenants:` in gateway.yaml) "
                                                         "that may use this route")


class TenantAllowlist(PluginBase[TenantAllowlistSettings]):
    name: ClassVar[str] = "tenant_allowlist"
    Settings: ClassVar[type[TenantAllowlistSettings]] = TenantAllowlistSettings
    # the route's check refuses a chain where no earlier plugin (auth) sets the tenant
    needs: ClassVar[frozenset[str]] = frozenset({"tenant"})

    def __init__(self, next: Handler, settings: TenantAllowlistSettings, services: Services,
                 route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.tenants = frozenset(settings.tenants)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if ctx.tenant is None:  # auth with `required: false`, and no key sent
            raise ApiError(ErrorKind.UNAUTHORIZED, headers={"WWW-Authenticate": 'Bearer realm="exports"'})
        if ctx.tenant not in self.tenants:
            log.info("tenant not on the route's allow-list", extra={"route": self.route, "tenant": ctx.tenant})
            raise ApiError(ErrorKind.NOT_FOUND, f"no route for {ctx.request.url.path}")
        return await self.next(ctx)
