"""policy.retry: idempotent requests are tried again on connect errors, timeouts, resets and chosen statuses.

Idempotent means GET, HEAD, or a request with a task id on the context
(`ctx.task_id`: a submit's create is idempotent by task id), so on a route with
other methods retry needs `task_id`, which the config check makes sure one of the
route's plugins provides. It is part of the route's upstream call, inside the
timeout and around the breaker (gateway/policy/__init__.py). Backoff is
exponential with full jitter; an upstream `Retry-After` is honoured when it fits
in what is left of the total deadline. A retry budget per upstream caps retries
at a share of requests (gateway/retry_budget.py), so a failing upstream is not
hit with three times its load.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from exports_common.backoff import backoff, retry_after_seconds
from exports_common.body_bounds import BodyBytes
from gateway.context import Handler, RequestContext
from gateway.plugins.base import RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.retry_budget import RetryBudget, RetryBudgets
from gateway.services import Services
from gateway.telemetry import Tally
from gateway.upstream import UpstreamError

IDEMPOTENT_METHODS = ("GET", "HEAD")
Reason = Literal["connect_error", "timeout", "reset"] | int


class BackoffSettings(Settings):
    initial: float = Field(0.05, ge=0, description="seconds before the first retry (upper bound of the jitter)")
    max: float = Field(2.0, ge=0)
    multiplier: float = Field(2.0, ge=1)


class BudgetSettings(Settings):
    ratio: float = Field(0.2, ge=0, le=1, description="retries per request, and in flight per request in flight")
    min_concurrent: int = Field(3, ge=0, description="retries allowed in flight whatever the load, and "
                                "retries allowed per window on top of the ratio")


def _default_retry_on() -> list[Reason]:
    return ["connect_error", "timeout", "reset", 502, 503, 504]


class RetrySettings(Settings):
    attempts: int = Field(3, ge=1, le=10, description="total tries, the first included")
    backoff: BackoffSettings = Field(default_factory=BackoffSettings)
    retry_on: list[Reason] = Field(default_factory=_default_retry_on)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    max_body_bytes: BodyBytes = Field(1_048_576, ge=0, description="a body is kept to be sent again up to this size")


@dataclass(frozen=True)
class Counts:
    retries: Tally
    success: Tally
    budget_exhausted: Tally


def _counts(services: Services) -> Counts:
    metrics = services.metrics
    return Counts(
        metrics.tally("gateway_retries", ("upstream", "route", "reason"), "retry tries, by cause"),
        metrics.tally("gateway_retry_success", ("upstream", "route"),
                      "requests retried at least once whose last try was not worth retrying"),
        metrics.tally("gateway_retry_budget_exhausted", ("upstream", "route"),
                      "retries not made because the budget was used up"))


def _budgets(services: Services) -> RetryBudgets:
    """One budget per upstream, shared by every route's retry and kept across reloads."""
    return services.state.shared("retry_budgets", RetryBudgets)


def needs(settings: RetrySettings, methods: tuple[str, ...]) -> frozenset[str]:
    """The context fields a route's retry needs: a task id where it may retry a write."""
    writes = settings.attempts > 1 and any(m not in IDEMPOTENT_METHODS for m in methods)
    return frozenset({"task_id"}) if writes else frozenset()


def observe(services: Services) -> None:
    budgets = _budgets(services).by_upstream
    services.metrics.observe_gauge(
        "gateway_retries_in_flight", "retries in flight, by upstream (the budget caps them)",
        lambda: [(b.retries_in_flight, {"upstream": name}) for name, b in budgets.items()], merge="sum")


def stats(services: Services) -> dict[str, Any]:
    return {"retry_budget": {name: b.describe() for name, b in _budgets(services).by_upstream.items()}}


class Retry:
    def __init__(self, next: Handler, settings: RetrySettings, services: Services, route: RouteInfo) -> None:
        self.next = next
        self.settings = settings
        self.route = route.name
        self.kinds = {r for r in settings.retry_on if isinstance(r, str)}
        self.statuses = {r for r in settings.retry_on if isinstance(r, int)}
        self.counts = _counts(services)
        for reason in settings.retry_on:
            self.counts.retries.seed(route.upstream, route.name, str(reason))
        self.counts.success.seed(route.upstream, route.name)
        self.counts.budget_exhausted.seed(route.upstream, route.name)
        self.budget = _budgets(services).get(route.upstream)

    @staticmethod
    def _idempotent(ctx: RequestContext) -> bool:
        return ctx.method in IDEMPOTENT_METHODS or ctx.task_id is not None

    def _backoff(self, retry: int) -> float:
        b = self.settings.backoff
        return backoff(retry - 1, b.initial, b.max, b.multiplier, full_jitter=True)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if self.settings.attempts == 1 or not self._idempotent(ctx):
            return await self.next(ctx)
        if ctx.method not in IDEMPOTENT_METHODS:
            await ctx.read_body(self.settings.max_body_bytes)
        budget = self.budget
        budget.request_started()
        try:
            return await self._tries(ctx, budget)
        finally:
            budget.request_ended()

    async def _tries(self, ctx: RequestContext, budget: RetryBudget) -> GatewayResponse:
        """Try, and while the answer is worth retrying and time and budget allow, back off and try again.

        A retry holds a place in the budget only while it is in flight, as in Envoy.
        """
        attempt = 1
        result, reason, hint = await self._try(ctx, attempt)
        while reason is not None and attempt < self.settings.attempts:
            delay = self._delay(ctx, attempt, hint)
            if delay is None:
                break
            await asyncio.sleep(delay)
            if not budget.try_acquire(self.settings.budget.ratio, self.settings.budget.min_concurrent):
                self.counts.budget_exhausted.add(ctx.upstream, self.route)
                break
            if isinstance(result, GatewayResponse):
                result.close()
            self.counts.retries.add(ctx.upstream, self.route, str(reason))
            ctx.retry_reason = str(reason)
            attempt += 1
            try:
                result, reason, hint = await self._try(ctx, attempt)
            finally:
                budget.release()
        if attempt > 1 and reason is None:
            self.counts.success.add(ctx.upstream, self.route)
        if isinstance(result, UpstreamError):
            try:
                raise result
            finally:
                del result  # else this frame, held by the traceback, holds the error: a cycle per failure
        return result

    async def _try(self, ctx: RequestContext, attempt: int
                   ) -> tuple[GatewayResponse | UpstreamError, object, float | None]:
        """(answer or failure, why it is worth retrying or None, the upstream's Retry-After).

        A failure not worth retrying is raised at once, as it came.
        """
        ctx.attempt = attempt
        ctx.upstream_headers["x-gateway-attempt"] = str(attempt)
        ctx.response_headers["x-gateway-attempts"] = str(attempt)
        try:
            resp = await self.next(ctx)
        except UpstreamError as exc:
            if exc.kind not in self.kinds:
                raise  # straight on, with its own traceback (an open breaker's refusal takes this way)
            return exc, exc.kind, None
        if resp.status in self.statuses:
            return resp, resp.status, retry_after_seconds(resp.header("retry-after"))
        return resp, None, None

    def _delay(self, ctx: RequestContext, attempt: int, hint: float | None) -> float | None:
        """Seconds to wait before the next try, or None when it would not fit in the total deadline.

        The jittered backoff is added to an upstream's Retry-After too: otherwise every request
        refused in the same instant comes back in the same instant, and the in-flight cap of the
        budget turns most of them away.
        """
        delay = (hint or 0.0) + self._backoff(attempt)
        if ctx.deadline is not None and time.monotonic() + delay >= ctx.deadline:
            return None
        return delay
