"""list_query: the list route's query (`status`, `limit`, `cursor`) is checked at the edge.

A bad parameter is a 422 before any upstream call, so it never reaches the backend
and never counts toward a breaker; what goes upstream is the checked query, re-encoded.
"""
from __future__ import annotations

from typing import ClassVar
from urllib.parse import parse_qsl

from exports_common.list_query import check_list_query
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

MEMO_ENTRIES = 1024
MEMO_KEY_BYTES = 256


class ListQuerySettings(Settings):
    pass


class ListQuery(PluginBase[ListQuerySettings]):
    name: ClassVar[str] = "list_query"
    Settings: ClassVar[type[ListQuerySettings]] = ListQuerySettings
    provides: ClassVar[frozenset[str]] = frozenset({"query"})

    def __init__(self, next: Handler, settings: ListQuerySettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        # raw query -> checked query: clients poll with the same few queries, each checked once (a bad one is
        # never kept, so it is refused every time)
        self._checked: dict[bytes, str] = {}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        raw = ctx.request.scope["query_string"]
        query = self._checked.get(raw)
        if query is None:
            query = self._check(raw)
        ctx.query = query
        return await self.next(ctx)

    def _check(self, raw: bytes) -> str:
        # parsed as Starlette's query_params would be, without building its multi-dict for one pass
        query = check_list_query(parse_qsl(raw.decode("latin-1"), keep_blank_values=True)).encode()
        if len(raw) <= MEMO_KEY_BYTES:
            if len(self._checked) >= MEMO_ENTRIES:
                self._checked.clear()
            self._checked[raw] = query
        return query
