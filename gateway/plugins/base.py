"""What every plugin is: built once per route from its settings, then called for each request.

Like a Starlette middleware, a plugin wraps the next handler: it may act before
calling it, after it, or answer without calling it at all.
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from gateway.context import Handler, RequestContext
from gateway.response import GatewayResponse
from gateway.services import Services


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Plugin(Protocol):
    name: ClassVar[str]
    Settings: ClassVar[type[Any]]  # each plugin narrows it to its own model (protocol members are invariant)

    def __init__(self, next: Handler, settings: Any, services: Services, route: str) -> None: ...

    async def __call__(self, ctx: RequestContext) -> GatewayResponse: ...
