"""Delivers callbacks: signed, retried on a schedule, durable, fair across tenants, and apart from the workers.

The pending notification lives on the task record with the time it is next due,
so deliveries survive a restart. Every backend on a store polls the due deliveries;
each try is claimed in the store first (`TaskStore.claim_callback`), so one backend
sends it and only that one records the outcome: a notification reaches the receiver
once per try, and twice only when a backend dies mid-delivery and another takes its
claim over once the claim's lease has run out. No receiver can stall the sender:
- any failure of a try (refused address, bad name, reset, timeout, redirect, an
  exception nobody foresaw) is recorded as a failed try, so the schedule moves on;
- the answer's status is all that is used; the body is never read, so a huge or
  endless body costs nothing, and each try is bounded by `timeout_sec`;
- dispatch is fair: the free slots go round robin to the tenants with due
  deliveries, fewest in flight first, and no tenant holds more than its share;
- the connection goes to an address that passed the SSRF check (`PinnedResolver`),
  never to a second lookup's answer; the name is kept for Host and TLS.
Bodies are signed after Standard Webhooks; redirects are not followed; any 2xx
is delivered and a 410 stops at once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from typing import Any

import aiohttp

from backend_stub import lifecycle, metrics, tracing
from backend_stub.config import BackendConfig
from backend_stub.models import Task
from backend_stub.registry import Snapshot
from backend_stub.store import TaskStore, store_down
from exports_common import webhooks
from exports_common.contract import signed_link
from exports_common.netpolicy import AddressPolicy, PinnedResolver, RefusedAddress, refusal
from exports_common.periodic import periodic
from exports_common.signing import DownloadSigner
from exports_common.timefmt import rfc3339

log = logging.getLogger("backend.callbacks")


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class CallbackSender:
    def __init__(self, config: BackendConfig, store: TaskStore) -> None:
        self.config = config.callbacks
        self.links = config.download_links
        self.signer = DownloadSigner(config.download_links.secrets)
        self.store = store
        self.policy = AddressPolicy.from_lists(self.config.allow_hosts, self.config.allow_networks)
        self._resolver = PinnedResolver(self.policy)
        self.share = self.config.per_tenant_concurrency or max(1, self.config.concurrency // 2)
        self._in_flight: dict[str, str] = {}  # task id -> tenant
        self._tenant_of: dict[str, str] = {}  # due task id -> tenant, kept while the task stays due
        self._last_turn: dict[str, int] = {}  # tenant -> the turn it last got a slot on
        self._turn = 0
        self._logged: set[str] = set()  # task ids whose repeated failure was logged already
        self._deliveries: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        # whose claims these are: unique per process start, so a restarted backend does not pass for its old self
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"

    def apply(self, registry: Snapshot) -> None:
        """A reloaded allow-list: every later try is judged by it (its check and the pinned resolver's)."""
        self.policy = self._resolver.policy = registry.callback_policy

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False,
                                         limit=self.config.concurrency)
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        try:
            await periodic("callback dispatch", self._dispatch_due, self.config.poll_interval_sec, log,
                           expected=store_down("due callbacks wait"))
        finally:
            await self._session.close()

    async def _dispatch_due(self) -> None:
        due = await self.store.due_callbacks(time.time(), self.config.scan_limit)
        queues: dict[str, list[str]] = {}
        tenant_of: dict[str, str] = {}
        for task_id in due:
            if task_id in self._in_flight:
                continue
            tenant = self._tenant_of.get(task_id)
            if tenant is None:
                task = await self.store.get(task_id)
                if task is None:
                    continue
                tenant = task.tenant
            tenant_of[task_id] = tenant
            queues.setdefault(tenant, []).append(task_id)
        self._tenant_of = tenant_of
        self._last_turn = {t: turn for t, turn in self._last_turn.items() if t in queues}  # bounded by due tenants
        for task_id in self.pick(queues):
            self._in_flight[task_id] = tenant_of[task_id]
            delivery = asyncio.create_task(self._deliver(task_id))
            # the loop keeps only weak references to tasks: hold each until it ends
            self._deliveries.add(delivery)
            delivery.add_done_callback(self._deliveries.discard)

    def pick(self, queues: dict[str, list[str]]) -> list[str]:
        """Due deliveries to start now: one at a time to the tenant with the fewest in flight
        (the one served longest ago on a tie), none to a tenant at its share."""
        free = self.config.concurrency - len(self._in_flight)
        load = Counter(self._in_flight.values())
        waiting = {tenant: list(ids) for tenant, ids in queues.items() if load[tenant] < self.share}
        picked: list[str] = []
        while free > 0 and waiting:
            tenant = min(waiting, key=lambda t: (load[t], self._last_turn.get(t, 0)))
            picked.append(waiting[tenant].pop(0))
            load[tenant] += 1
            self._turn += 1
            self._last_turn[tenant] = self._turn
            free -= 1
            if not waiting[tenant] or load[tenant] >= self.share:
                del waiting[tenant]
        return picked

    def payload(self, task: Task, cb: dict[str, Any]) -> dict[str, Any]:
        event = cb["event"]
        download_url = None
        if event["has_result"] and event["expire_at"]:
            download_url = signed_link(self.signer, self.links.base(), task.task_id, event["expire_at"],
                                       self.links.path)
        return {
            "task_id": task.task_id, "status": event["status"], "download_url": download_url,
            "expire_at": rfc3339(event["expire_at"]) if event["expire_at"] else None,
            "error": event["error"], "attempt": event["attempt"], "callback_seq": cb["seq"],
        }

    async def _deliver(self, task_id: str) -> None:
        try:
            claim = await self.store.claim_callback(task_id, self.holder, self.config.claim_lease())
            if claim is None:  # another backend delivers it, or it is no longer due
                return
            task = claim.task
            cb = task.callback
            assert cb is not None  # a claim is taken on a pending notification only
            if claim.taken_over:
                metrics.callback_claims_taken_over.inc()
                log.warning("callback delivery taken over: its last claim ran out without an outcome (a backend "
                            "died mid-delivery, or could not reach the store); the receiver may get this "
                            "notification twice, with the same webhook-id",
                            extra={"task_id": task_id, "callback_seq": claim.seq})
            try:
                with tracing.callback_delivery(task, cb["seq"], cb["attempts"] + 1) as trace_headers:
                    error, final = await self._try(task, cb, trace_headers)
            except Exception as exc:  # noqa: BLE001 - whatever failed, it was one failed try: the schedule moves on
                error, final = error_text(exc), False
            _, recorded = await self.store.update(task_id, lifecycle.callback_attempted(
                cb["seq"], error, self.config.retry_delays_sec, final), claim=claim)
            if not recorded:
                log.warning("callback outcome not recorded: this delivery's claim ran out and another backend "
                            "took it over", extra={"task_id": task_id, "callback_seq": cb["seq"], "error": error})
                return
            outcome = "delivered" if error is None else ("failed" if final else "will retry")
            metrics.callback_tried(metrics.callback_outcome(error, final or cb["attempts"] >= len(
                self.config.retry_delays_sec)), task.finished_at)
            log.info(f"callback {outcome}", extra={"task_id": task_id, "callback_seq": cb["seq"],
                                                    "try": cb["attempts"] + 1, "error": error})
            self._logged.discard(task_id)
        except Exception as exc:  # noqa: BLE001 - the store failed: the delivery stays due, tried again later
            if task_id not in self._logged:
                self._logged.add(task_id)
                log.warning("callback delivery could not be recorded; it stays due",
                            extra={"task_id": task_id, "error": error_text(exc)})
        finally:
            self._in_flight.pop(task_id, None)

    async def _try(self, task: Task, cb: dict[str, Any], trace_headers: dict[str, str]) -> tuple[str | None, bool]:
        """(why it failed or None, whether that is final)."""
        url = task.callback_url or ""
        reason = await refusal(url, self.policy, resolve=False)  # names are judged by the pinned resolver
        if reason is not None:
            return f"refused: {reason}", True
        secrets = self.config.secrets_for(task.tenant)
        if not secrets:
            return "no webhook secret is configured for this tenant", True
        body = json.dumps(self.payload(task, cb), separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "user-agent": "export-backend-callbacks/1"}
        headers |= webhooks.sign(secrets, cb["webhook_id"], body)
        headers |= trace_headers
        assert self._session is not None
        try:
            async with self._session.post(url, data=body, headers=headers, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=self.config.timeout_sec)) as resp:
                # the status is the answer; the body is never read, so its size cannot matter
                if 200 <= resp.status < 300:
                    return None, False
                return f"the receiver answered {resp.status}", resp.status == 410
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):  # refused now, refused on every try: final
                return f"refused: {exc.os_error}", True
            return error_text(exc), False
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return error_text(exc), False
