"""validate: the submit body is checked at the edge, so bad requests never reach the backend.

Content type (415), size (413), JSON syntax (400), nesting and field types (422),
the export type and format against the route's upstream's registry (422, gateway/type_registry.py),
and the callback URL: refused unless it is public or on the backend's allow-list (SSRF).
It provides `body` and `json` on the context for the plugins and the proxy after it.

Two settings are from before the backend owned the registry and load with a warning: an
`export_types` list only narrows the registry, and a `callback` allow-list is added to the
backend's (which still re-checks every delivery with its own).
"""
from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from pydantic import Field

from exports_common.body_bounds import BodyBytes, FiltersBytes
from exports_common.errors import validation_error
from exports_common.json_body import MAX_DEPTH, parse_json
from exports_common.netpolicy import AddressPolicy, refusal
from exports_common.submit_body import SubmitBody, check_submit_body
from gateway.context import Handler, RequestContext
from gateway.plugins.base import CurrentServices, PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.type_registry import Learned, refresh_forever, registries


class CallbackPolicy(Settings):
    """Deprecated: the backend's callbacks.allow_hosts / allow_networks are learned from it; a list here is added."""

    allow_hosts: list[str] = Field(default_factory=list, description="deprecated (set callbacks.allow_hosts in "
                                   "backend.yaml): host names allowed although not public")
    allow_networks: list[str] = Field(default_factory=list, description="deprecated (set callbacks.allow_networks "
                                      "in backend.yaml): CIDRs allowed although not public")


class ValidateSettings(Settings):
    max_body_bytes: BodyBytes = Field(65_536, ge=64)
    max_depth: int = Field(MAX_DEPTH, ge=2, le=256)
    export_types: list[str] | None = Field(None, description=(
        "deprecated: the types come from the upstream's registry; a list here only narrows it"))
    default_timeout_sec: int = Field(300, ge=1)
    max_timeout_sec: int = Field(3600, ge=1)
    max_filters_bytes: FiltersBytes = Field(8_192, ge=64)
    callback: CallbackPolicy = Field(default_factory=CallbackPolicy)


class Validate(PluginBase[ValidateSettings]):
    name: ClassVar[str] = "validate"
    Settings: ClassVar[type[ValidateSettings]] = ValidateSettings
    provides: ClassVar[frozenset[str]] = frozenset({"body", "json"})

    def __init__(self, next: Handler, settings: ValidateSettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.own_policy = AddressPolicy.from_lists(settings.callback.allow_hosts, settings.callback.allow_networks)
        self.registry = registries(services).of(route.upstream)
        self._policy: tuple[Learned | None, AddressPolicy] = (None, self.own_policy)

    @classmethod
    def accepts(cls, settings: ValidateSettings) -> dict[str, Any]:
        return {"export_types": settings.export_types, "max_timeout_sec": settings.max_timeout_sec}

    @classmethod
    def deprecations(cls, settings: ValidateSettings) -> list[str]:
        found = []
        if settings.export_types is not None:
            found.append("validate.export_types: the gateway learns the export types from the backend; this list "
                         "only narrows them: remove it")
        if settings.callback.allow_hosts or settings.callback.allow_networks:
            found.append("validate.callback.allow_hosts/allow_networks: the backend's callbacks.allow_hosts/"
                         "allow_networks are learned from it; move these to backend.yaml")
        return found

    @classmethod
    def background(cls, current: CurrentServices) -> list[Coroutine[Any, Any, None]]:
        return [refresh_forever(current)]

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        s = self.settings
        headers = ctx.headers
        body = await ctx.read_body(s.max_body_bytes)
        value = parse_json(body, headers.get("content-type"), s.max_depth)
        shape = check_submit_body(value, s.export_types, s.max_timeout_sec, s.default_timeout_sec,
                                  s.max_filters_bytes)
        await self._check_registry(shape)
        if shape.callback_url is not None:
            reason = await refusal(shape.callback_url, self._callback_policy())
            if reason is not None and self.registry.learned is None:  # nothing learned yet: try once more
                await self.registry.refresh_on_miss(self.services)
                reason = await refusal(shape.callback_url, self._callback_policy())
            if reason is not None:
                raise validation_error("callback_url", f"refused: {reason}; ask the operator to allow-list it")
        ctx.json = value
        return await self.next(ctx)

    async def _check_registry(self, shape: SubmitBody) -> None:
        """The type and format against the upstream's registry, read again once before refusing (a type just
        added); with no registry ever learned (the backend unreachable since start), the backend decides."""
        if not _offers(self.registry.learned, shape):
            await self.registry.refresh_on_miss(self.services)
        learned = self.registry.learned
        if learned is None or _offers(learned, shape):
            return
        offered = learned.formats.get(shape.export_type)
        if offered is None:
            raise validation_error("export_type", f"must be one of {sorted(learned.formats)}")
        raise validation_error("format", f"export type {shape.export_type} offers {', '.join(offered)}")

    def _callback_policy(self) -> AddressPolicy:
        """The backend's allow-list, with the deprecated one of this route's settings added."""
        learned = self.registry.learned
        if self._policy[0] is not learned and learned is not None:
            theirs = learned.callbacks
            self._policy = (learned, AddressPolicy(self.own_policy.allow_hosts | theirs.allow_hosts,
                                                   self.own_policy.allow_networks + theirs.allow_networks))
        return self._policy[1]


def _offers(learned: Learned | None, shape: SubmitBody) -> bool:
    if learned is None:
        return False
    offered = learned.formats.get(shape.export_type)
    return offered is not None and (shape.format is None or shape.format in offered)
