"""Operator recovery on the admin API: dead letters and failed tasks, re-delivery and re-run.

Each endpoint takes the admin token, forwards to the backend's `/internal/`
endpoints (which only the gateway calls), writes an audit line (logger
`gateway.audit`, with the request's trace id) and counts the action in
`gateway_operator_actions_total`. Each is traced as a request to the gateway is:
an operator's re-run links back to it, as a TIMEOUT re-run links to the poll.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable
from urllib.parse import urlencode

from opentelemetry.trace import StatusCode
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exports_common.errors import ApiError, ErrorKind
from exports_common.json_body import read_limited
from exports_common.jsonlog import trace_id_var
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.telemetry import inject
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.audit")
MAX_BODY = 65_536
Endpoint = Callable[[Request], Awaitable[Response]]
_ACTIONS = [  # the admin API's path, its method, the action's name, the backend's internal endpoint
    ("/admin/recovery/callbacks", "GET", "list_dead_letters", "/internal/callbacks/failed"),
    ("/admin/recovery/tasks", "GET", "list_failed_tasks", "/internal/tasks"),
    ("/admin/recovery/callbacks/redeliver", "POST", "redeliver_batch", "/internal/callbacks/redeliver"),
    ("/admin/recovery/tasks/{task_id}/redeliver", "POST", "redeliver", "/internal/tasks/{task_id}/redeliver"),
    ("/admin/recovery/tasks/{task_id}/rerun", "POST", "rerun", "/internal/tasks/{task_id}/rerun"),
]


class AdminRecovery:
    def __init__(self, services: Callable[[], Services], require_admin: Callable[[Request], Awaitable[None]],
                 upstream: Callable[[], str]) -> None:
        self.services = services
        self.require_admin = require_admin
        self.upstream = upstream

    def routes(self) -> list[Route]:
        return [Route(path, self._forward(action, path, backend), methods=[method])
                for path, method, action, backend in _ACTIONS]

    def _forward(self, action: str, route: str, path: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            await self.require_admin(request)
            services = self.services()
            # traced as a request to the gateway is, so that what it causes (a re-run's export) links back to it
            with services.tracing.server(request.method, route, action, request.headers,
                                         request.scope.get("client")) as admin_trace:
                trace_id_var.set(admin_trace.trace_id)
                answer, content = await self._call(request, action, path, services)
                admin_trace.span.set_attribute("http.response.status_code", answer.status)
            self._audit(request, action, "done" if answer.status < 400 else f"refused_{answer.status}", services,
                        content if request.method == "POST" else b"")
            return Response(content, status_code=answer.status, media_type="application/json")

        return endpoint

    async def _call(self, request: Request, action: str, path: str, services: Services
                    ) -> tuple[GatewayResponse, bytes]:
        """The backend's answer to the internal endpoint, with the admin request's trace headers."""
        upstream = services.upstreams[self.upstream()]
        query = urlencode([(k, v) for k, v in request.query_params.multi_items()
                           if k in ("tenant", "status", "limit", "cursor")])
        url = upstream.url + path.format(**request.path_params) + (f"?{query}" if query else "")
        body = None
        headers = [("accept", "application/json"), *upstream.auth]
        if request.method == "POST":
            body = await read_limited(request.stream(), MAX_BODY, request.headers.get("content-length"))
            headers.append(("content-type", request.headers.get("content-type", "application/json")))
        with services.tracing.client(f"upstream {self.upstream()}", lambda: {
                "http.request.method": request.method, "url.full": url, "gateway.operator_action": action}) as span:
            carrier: dict[str, str] = {}
            inject(carrier)
            try:
                # the whole call, its answer read whole included, within connect + 3 x read: a backend that
                # trickles its answer (each read quick) cannot hold an operator's request longer
                async with asyncio.timeout(upstream.timeouts.connect + 3 * upstream.timeouts.read):
                    answer = await services.client.request(request.method, url, headers + list(carrier.items()),
                                                           body, upstream.timeouts)
                    content = await answer.read()
            except UpstreamError as exc:
                span.set_status(StatusCode.ERROR, str(exc))
                self._audit(request, action, "unreachable", services)
                raise ApiError(ErrorKind.UPSTREAM_UNREACHABLE, data={"reason": exc.kind}) from exc
            except TimeoutError as exc:
                span.set_status(StatusCode.ERROR, "timeout")
                self._audit(request, action, "timeout", services)
                raise ApiError(ErrorKind.UPSTREAM_TIMEOUT, data={"reason": "total"}) from exc
            span.set_attribute("http.response.status_code", answer.status)
        return answer, content

    def _audit(self, request: Request, action: str, outcome: str, services: Services, answer: bytes = b"") -> None:
        services.metrics.operator_actions.add(action, outcome)
        client = request.client
        detail: object = None
        if answer:
            try:
                detail = json.loads(answer).get("data")
            except (ValueError, AttributeError):
                detail = None
        log.info("operator action", extra={
            "action": action, "outcome": outcome, "task_id": request.path_params.get("task_id"),
            "tenant": request.query_params.get("tenant"), "client": client.host if client else None,
            "result": detail if action == "redeliver_batch" else None})
