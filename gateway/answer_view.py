"""A route's answer for a task the gateway asks about itself: what a client polling that route would get.

An event stream carries, in each event, what the status route would answer at that
moment: the link signed, a submission still in the outbox shown as PENDING, a TIMEOUT
that the route re-runs re-run first. Rather than restate that, a stream asks the status
route's own plugins, through its view: the route's chain without its gatekeepers (auth,
rate_limit, task_id: a stream runs those once, on its own route, when it opens), ending
in `HeldAnswer`, which answers with the state the gateway already holds (a change the
upstream's feed pushed) or, holding none, makes the route's upstream call. So a plugin
that shapes the status route's answers shapes every event the same way, with no code of
its own for streams, and a plugin that makes calls of its own (rerun) makes them through
the route's upstream policy.
"""
from __future__ import annotations

from typing import Any, Awaitable

from gateway.context import Handler, RequestContext
from gateway.path_params import fill
from gateway.response import GatewayResponse


class HeldAnswer:
    """The last handler of a view: the held state as the upstream would have answered it, else the upstream call."""

    def __init__(self, call_upstream: Handler) -> None:
        self.call_upstream = call_upstream

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if ctx.held is None:
            return await self.call_upstream(ctx)
        return GatewayResponse.envelope(ctx.held)


class AnswerView:
    """Route `name`'s answer for one task, asked on behalf of `origin` (the stream's request: its tenant,
    the headers sent upstream, the address links are built for)."""

    def __init__(self, name: str, upstream: str, param: str, rewrite: str, handler: Handler) -> None:
        self.name = name
        self.upstream = upstream
        self.param = param
        self.rewrite = rewrite
        self.handler = handler

    def answer(self, origin: RequestContext, task_id: str,
               held: dict[str, Any] | None) -> Awaitable[GatewayResponse]:
        """The route's answer for `task_id`, from `held` or from the upstream."""
        params = {self.param: task_id}
        ctx = RequestContext(origin.scope, origin.receive, origin.header_values, "GET", origin.route_name,
                             self.upstream, fill(self.rewrite, params), params, origin.request_id,
                             upstream_headers=dict(origin.upstream_headers), query="",
                             tenant=origin.tenant, caller=origin.caller, caller_resolved=origin.caller_resolved,
                             task_id=task_id, held=held)
        return self.handler(ctx)
