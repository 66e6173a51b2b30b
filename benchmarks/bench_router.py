"""Route matching: the gateway's Router (Starlette's compile_path) against the hand-written template
compiler it replaced, over the routes of config/gateway.yaml. In-process; a ratio of the same run.

    python -m benchmarks.bench_router
"""
from __future__ import annotations

import re
import timeit

from exports_common.config_loader import load_model
from gateway.config import GatewayConfig, RouteConfig
from gateway.router import Router

_PARAM = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
PATHS = [("POST", "/api/v1/exports"), ("GET", "/api/v1/exports/exp-20261129-aaaaaaaaaaaaaaaaaaaa"),
         ("GET", "/api/v1/exports/exp-20261129-aaaaaaaaaaaaaaaaaaaa/download"), ("GET", "/nowhere")]


class HandRouter(Router):
    """The template compiler before the change (re.escape the text, `[^/]+` per param)."""

    def __init__(self, routes: list[RouteConfig]) -> None:
        def pattern(path: str) -> re.Pattern[str]:
            parts = _PARAM.split(path)
            regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
            return re.compile(f"^{regex}$")

        self._compiled = [(pattern(r.path), r) for r in routes]


def main() -> None:
    routes = load_model("config/gateway.yaml", GatewayConfig).routes
    for name, router in (("hand-written", HandRouter(routes)), ("compile_path", Router(routes))):
        def run(router: Router = router) -> None:
            for method, path in PATHS:
                router.match(method, path)

        best = min(timeit.repeat(run, number=20_000, repeat=5)) / (20_000 * len(PATHS))
        print(f"{name:>13}: {best * 1e6:.2f} us per match")


if __name__ == "__main__":
    main()
