"""Matches a request to a configured route: path with {params}, then method."""
from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.config import RouteConfig

_PARAM = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


@dataclass(frozen=True)
class Match:
    route: RouteConfig
    params: dict[str, str]

    def upstream_path(self, raw_path: str) -> str:
        return self.route.rewrite.format(**self.params) if self.route.rewrite else raw_path


class Router:
    def __init__(self, routes: list[RouteConfig]) -> None:
        self._compiled = [(self._pattern(r.path), r) for r in routes]

    @staticmethod
    def _pattern(path: str) -> re.Pattern[str]:
        parts = _PARAM.split(path)
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
        return re.compile(f"^{regex}$")

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
