"""Operator recovery on the admin API: dead letters and failed tasks, re-delivery and re-run.

Each endpoint takes the admin token, forwards to the backend's `/internal/`
endpoints (which only the gateway calls), writes an audit line (logger
`gateway.audit`) and counts the action in `gateway_operator_actions_total`.
"""
from __future__ import annotations

import json
import logging
from typing import Awaitable, Callable
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exports_common.errors import ApiError, ErrorKind
from exports_common.json_body import read_limited
from gateway.services import Services
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.audit")
MAX_BODY = 65_536
Endpoint = Callable[[Request], Awaitable[Response]]


class AdminRecovery:
    def __init__(self, services: Callable[[], Services], require_admin: Callable[[Request], None],
                 upstream: Callable[[], str]) -> None:
        self.services = services
        self.require_admin = require_admin
        self.upstream = upstream

    def routes(self) -> list[Route]:
        return [
            Route("/admin/recovery/callbacks", self._forward("list_dead_letters", "/internal/callbacks/failed"),
                  methods=["GET"]),
            Route("/admin/recovery/tasks", self._forward("list_failed_tasks", "/internal/tasks"), methods=["GET"]),
            Route("/admin/recovery/callbacks/redeliver",
                  self._forward("redeliver_batch", "/internal/callbacks/redeliver"), methods=["POST"]),
            Route("/admin/recovery/tasks/{task_id}/redeliver",
                  self._forward("redeliver", "/internal/tasks/{task_id}/redeliver"), methods=["POST"]),
            Route("/admin/recovery/tasks/{task_id}/rerun",
                  self._forward("rerun", "/internal/tasks/{task_id}/rerun"), methods=["POST"]),
        ]

    def _forward(self, action: str, path: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            self.require_admin(request)
            services = self.services()
            upstream = services.upstreams[self.upstream()]
            query = urlencode([(k, v) for k, v in request.query_params.multi_items()
                               if k in ("tenant", "status", "limit", "cursor")])
            url = upstream.url + path.format(**request.path_params) + (f"?{query}" if query else "")
            body = None
            headers = [("accept", "application/json")]
            if request.method == "POST":
                body = await read_limited(request.stream(), MAX_BODY, request.headers.get("content-length"))
                headers.append(("content-type", request.headers.get("content-type", "application/json")))
            try:
                answer = await services.client.request(request.method, url, headers, body, upstream.timeouts)
                content = await answer.read()
            except UpstreamError as exc:
                self._audit(request, action, "unreachable", services)
                raise ApiError(ErrorKind.UPSTREAM_UNREACHABLE, data={"reason": exc.kind}) from exc
            self._audit(request, action, "done" if answer.status < 400 else f"refused_{answer.status}", services,
                        content if request.method == "POST" else b"")
            return Response(content, status_code=answer.status, media_type="application/json")

        return endpoint

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
