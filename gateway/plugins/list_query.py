"""list_query: the list route's query (`status`, `limit`, `cursor`) is checked at the edge.

A bad parameter is a 422 before any upstream call, so it never reaches the backend
and never counts toward a breaker; what goes upstream is the checked query, re-encoded.
"""
from __future__ import annotations

from typing import ClassVar
from urllib.parse import parse_qsl

from exports_common.list_query import check_list_query
from gateway.context import RequestContext
from gateway.plugins.base import PluginBase, Settings
from gateway.response import GatewayResponse


class ListQuerySettings(Settings):
    pass


class ListQuery(PluginBase[ListQuerySettings]):
    name: ClassVar[str] = "list_query"
    Settings: ClassVar[type[ListQuerySettings]] = ListQuerySettings
    provides: ClassVar[frozenset[str]] = frozenset({"query"})

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        # parsed as Starlette's query_params are, without its multi-dict: the pairs are read once
        pairs = parse_qsl(ctx.scope["query_string"].decode("latin-1"), keep_blank_values=True)
        ctx.query = check_list_query(pairs).encode()
        return await self.next(ctx)
