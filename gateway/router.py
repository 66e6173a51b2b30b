"""Matches a request to a configured route: path with {params} (Starlette's templates), then method."""
from __future__ import annotations

import re
from typing import NamedTuple

from starlette.routing import compile_path

from gateway.config import RouteConfig
from gateway.path_params import encode_segments, fill, multi_segment_params


class Match(NamedTuple):
    """The route a request matched, and its path's parameters."""

    route: RouteConfig
    params: dict[str, str]

    def upstream_path(self, path: str) -> str:
        """The path sent upstream (ApiError 404 for a dot segment); `path` is the request's, decoded."""
        rewrite = self.route.rewrite
        if rewrite:
            return fill(rewrite, self.params, multi_segment_params(self.route.path))
        return encode_segments(path, keep_slash=True)


class Router:
    def __init__(self, routes: list[RouteConfig]) -> None:
        # params stay strings (a `{id:int}` only narrows what matches): rewrites format them into a path.
        # A path without params is compared as a string, not through a regex
        self._compiled: list[tuple[re.Pattern[str] | str, RouteConfig]] = [
            (compile_path(r.path)[0] if "{" in r.path else r.path, r) for r in routes]

    def match(self, method: str, path: str) -> Match | list[str]:
        """The match, or the methods this path allows (empty: no route has this path)."""
        allowed: list[str] = []
        for pattern, route in self._compiled:
            if isinstance(pattern, str):
                if pattern != path:
                    continue
                params: dict[str, str] = {}
            else:
                found = pattern.match(path)
                if found is None:
                    continue
                params = found.groupdict()
            if method in route.methods or (method == "HEAD" and "GET" in route.methods):
                return Match(route, params)
            allowed += route.methods
        return sorted(set(allowed))
