"""Matches a request to a configured route: path with {params} (Starlette's templates), then method."""
from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.routing import compile_path

from gateway.config import RouteConfig


@dataclass(frozen=True)
class Match:
    route: RouteConfig
    params: dict[str, str]

    def upstream_path(self, raw_path: str) -> str:
        return self.route.rewrite.format(**self.params) if self.route.rewrite else raw_path


class Router:
    def __init__(self, routes: list[RouteConfig]) -> None:
        # params stay strings (a `{id:int}` only narrows what matches): rewrites format them into a path
        self._compiled: list[tuple[re.Pattern[str], RouteConfig]] = [(compile_path(r.path)[0], r) for r in routes]

    def match(self, method: str, path: str) -> Match | list[str]:
        """The match, or the methods this path allows (empty: no route has this path)."""
        allowed: list[str] = []
        for pattern, route in self._compiled:
            found = pattern.match(path)
            if found is None:
                continue
            if method in route.methods or (method == "HEAD" and "GET" in route.methods):
                return Match(route, found.groupdict())
            allowed += route.methods
        return sorted(set(allowed))
