"""validate: the submit body is checked at the edge, so bad requests never reach the backend.

Content type (415), size (413), JSON syntax (400), nesting and field types (422),
and the callback URL: refused unless it is public or allow-listed here (SSRF).
It provides `body` and `json` on the context for the plugins and the proxy after it.
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from exports_common.errors import validation_error
from exports_common.json_body import MAX_DEPTH, parse_json
from exports_common.netpolicy import AddressPolicy, refusal
from exports_common.submit_body import check_submit_body
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services


class CallbackPolicy(Settings):
    allow_hosts: list[str] = Field(default_factory=list, description="host names allowed although not public")
    allow_networks: list[str] = Field(default_factory=list, description="CIDRs allowed although not public")


class ValidateSettings(Settings):
    max_body_bytes: int = Field(65_536, ge=64)
    max_depth: int = Field(MAX_DEPTH, ge=2, le=256)
    export_types: list[str] | None = Field(None, description="checked at the edge when listed")
    default_timeout_sec: int = Field(300, ge=1)
    max_timeout_sec: int = Field(3600, ge=1)
    max_filters_bytes: int = Field(8_192, ge=64)
    callback: CallbackPolicy = Field(default_factory=CallbackPolicy)


class Validate(PluginBase[ValidateSettings]):
    name: ClassVar[str] = "validate"
    Settings: ClassVar[type[ValidateSettings]] = ValidateSettings
    provides: ClassVar[frozenset[str]] = frozenset({"body", "json"})

    def __init__(self, next: Handler, settings: ValidateSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.policy = AddressPolicy.from_lists(settings.callback.allow_hosts, settings.callback.allow_networks)

    @classmethod
    def accepts(cls, settings: ValidateSettings) -> dict[str, Any]:
        return {"export_types": settings.export_types, "max_timeout_sec": settings.max_timeout_sec}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        s = self.settings
        headers = ctx.request.headers
        body = await ctx.read_body(s.max_body_bytes)
        value = parse_json(body, headers.get("content-type"), s.max_depth)
        shape = check_submit_body(value, s.export_types, s.max_timeout_sec, s.default_timeout_sec,
                                  s.max_filters_bytes)
        if shape.callback_url is not None:
            reason = await refusal(shape.callback_url, self.policy)
            if reason is not None:
                raise validation_error("callback_url", f"refused: {reason}; ask the operator to allow-list it")
        ctx.json = value
        return await self.next(ctx)
