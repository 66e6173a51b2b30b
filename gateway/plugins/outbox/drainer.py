"""Delivers outboxed submissions, oldest first, once the upstream answers again.

Deliveries go through the upstream's breaker like any call, so with no client
traffic at all the drainer itself is the trial request that closes it.

With a shared (Redis) outbox, one gateway drains at a time, which keeps the
order. It holds the drain lock only while it delivers: when a delivery fails (its
upstream or its path to it is down) it lets go at once, so any other gateway
that can reach the upstream drains next, oldest first. The lock's lease covers
one delivery and is renewed before each, so a gateway that dies holding it
delays the others by at most that lease.

Each delivery is a span in the trace of the submit that was outboxed (a child of
that request's span, linked to it), so the task's trace goes on from there.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from typing import Any, Callable

from opentelemetry.trace import StatusCode
from redis.exceptions import RedisError

from exports_common.backoff import backoff, retry_after_seconds
from exports_common.errors import ApiError
from exports_common.periodic import periodic
from gateway.breakers import guarded
from gateway.plugins.outbox.store import OutboxItem, OutboxStore
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.telemetry import Tally, inject
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.outbox")
FAILURE_STATUSES = frozenset({500, 502, 503, 504})
# this submission's refusals for now (a timeout, too early, a quota): it keeps its place and is tried again later,
# while those behind it go on. A 5xx (503 included) stops the drain, which backs off; any other 4xx refuses the
# submission for good and its task reads FAILED
TRANSIENT_STATUSES = frozenset({408, 425, 429})
MAX_DEFERRAL_SEC = 60.0
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})  # the submit's, stored with it: replaced by the delivery's


class OutboxDrainer:
    def __init__(self, services: Callable[[], Services], store: OutboxStore, delivered: Tally,
                 interval_sec: float = 0.5, max_backoff_sec: float = 5.0):
        self.services = services
        self.store = store
        self.delivered = delivered
        self.interval = interval_sec
        self.max_backoff = max_backoff_sec
        self.owner = f"{socket.gethostname()}-{os.getpid()}"

    async def run(self) -> None:
        await periodic("outbox drain", self.drain_once, self.interval, log, max_backoff_sec=self.max_backoff,
                       expected={RedisError: "the shared outbox (Redis) does not answer; outboxed submissions "
                                             "wait until it does: check that Redis runs at redis_url"})

    async def drain_once(self) -> bool:
        """Deliver what can be delivered; False when the upstream is still failing."""
        services = self.services()
        outbox = self.store
        while True:
            if not await outbox.lock(self.owner, ttl=self._lease(services)):
                return True
            item = await outbox.oldest(time.time())
            if item is None:
                await outbox.unlock(self.owner)
                return True
            outcome = await self._deliver(services, item)
            if outcome is None:
                await outbox.unlock(self.owner)
                return False
            if outcome.error is not None:
                await outbox.refuse(outcome)
            elif outcome.not_before > item.not_before:
                await outbox.defer(outcome)
            else:
                await outbox.remove(item.task_id)

    @staticmethod
    def _lease(services: Services) -> float:
        """Long enough for one delivery to end (connect + read timeouts) before another gateway may start."""
        return 1.0 + max((u.timeouts.connect + u.timeouts.read for u in services.upstreams.values()), default=5.0)

    async def _deliver(self, services: Services, item: OutboxItem) -> OutboxItem | None:
        """The item delivered, refused for good (its `error` set) or for now (a later `not_before`), or None: the
        upstream is failing, try again later."""
        upstream = services.upstreams.get(item.upstream)
        if upstream is None:
            log.error("outboxed submission names an upstream the config no longer has; kept",
                      extra={"task_id": item.task_id, "upstream": item.upstream})
            return None

        url = upstream.url + item.path
        stored = {name: value for name, value in item.headers if name in _TRACE_HEADERS}
        attributes = {"http.request.method": item.method, "url.full": url, "gateway.tenant": item.tenant,
                      "export.task_id": item.task_id, "gateway.outbox.wait_sec": time.time() - item.created_at}
        with services.tracing.delivery(f"outbox delivery {item.upstream}", stored, attributes) as span:
            carrier: dict[str, str] = {}
            inject(carrier)
            headers = [h for h in item.headers if h[0] not in _TRACE_HEADERS] + list(carrier.items()) + [
                *upstream.auth]

            # the delivery, its answer read whole, ends within the drain lock's lease
            timeouts = upstream.timeouts._replace(
                deadline=time.monotonic() + upstream.timeouts.connect + upstream.timeouts.read)

            async def call() -> GatewayResponse:
                return await services.client.request(item.method, url, headers, item.body_bytes, timeouts)

            breaker = services.breakers.by_upstream.get(item.upstream)
            try:
                resp = await (guarded(breaker, call, FAILURE_STATUSES, item.tenant) if breaker else call())
                body = await resp.read()
            except (UpstreamError, ApiError) as exc:  # ApiError: the tenant's own breaker is open
                span.set_status(StatusCode.ERROR, str(exc))
                log.info("outbox delivery deferred", extra={"task_id": item.task_id, "error": str(exc)})
                return None
            span.set_attribute("http.response.status_code", resp.status)
        if resp.status >= 500:  # 503 too: the upstream is failing for everyone, the drain backs off
            return None
        if resp.status in TRANSIENT_STATUSES:
            # this submission alone waits (one tenant's quota must not hold the others' back)
            self.delivered.add("deferred")
            wait = deferral_sec(item.deferrals, retry_after_seconds(resp.header("retry-after")))
            log.info("outbox delivery deferred: the upstream refused it for now",
                     extra={"task_id": item.task_id, "status": resp.status, "retry_in_sec": round(wait, 1)})
            return dataclasses.replace(item, deferrals=item.deferrals + 1, not_before=time.time() + wait)
        if resp.status < 400:
            self.delivered.add("delivered")
            log.info("outboxed submission delivered", extra={"task_id": item.task_id, "status": resp.status})
            return item
        self.delivered.add("refused")
        log.error("outboxed submission refused by the upstream; its task reads FAILED",
                  extra={"task_id": item.task_id, "status": resp.status})
        return dataclasses.replace(item, error=refusal(resp.status, body))


def deferral_sec(deferrals: int, retry_after: float | None) -> float:
    """How long a submission refused for now waits: the upstream's Retry-After, else 1 s doubling to a minute
    (jittered, so that submissions refused together do not come back together)."""
    return min(MAX_DEFERRAL_SEC, max(retry_after or 0.0, backoff(deferrals, 1.0, MAX_DEFERRAL_SEC)))


def refusal(status: int, body: bytes) -> dict[str, Any]:
    """The task's error for a submission its upstream refused: the upstream's own code and message."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    code = doc.get("code") if isinstance(doc, dict) else None
    message = doc.get("message") if isinstance(doc, dict) else None
    return {"code": f"SUBMIT_REFUSED_{code if isinstance(code, int) else status}",
            "message": f"the export service refused the submission held by the gateway ({status}): "
                       f"{message if isinstance(message, str) else body[:200].decode('utf-8', 'replace')}"[:500],
            "retryable": False}
