"""Delivers callbacks: signed, retried on a schedule, durable, and apart from the export workers.

The pending notification lives on the task record with the time it is next due,
so deliveries survive a restart. Each try checks the receiver's address again
(a name may resolve differently now), signs the body after Standard Webhooks,
does not follow redirects, and counts any 2xx as delivered; a 410 stops at once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

from backend_stub import lifecycle
from backend_stub.config import BackendConfig
from backend_stub.models import Task
from backend_stub.store import TaskStore
from exports_common import webhooks
from exports_common.netpolicy import AddressPolicy, refusal
from exports_common.signing import DownloadSigner
from exports_common.timefmt import rfc3339

log = logging.getLogger("backend.callbacks")


class CallbackSender:
    def __init__(self, config: BackendConfig, store: TaskStore) -> None:
        self.config = config.callbacks
        self.links = config.download_links
        self.signer = DownloadSigner(config.download_links.secrets)
        self.store = store
        self.policy = AddressPolicy.from_lists(self.config.allow_hosts, self.config.allow_networks)
        self._in_flight: set[str] = set()
        self._deliveries: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        try:
            while True:
                try:
                    await self._dispatch_due()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("callback dispatch failed; will try again")
                await asyncio.sleep(self.config.poll_interval_sec)
        finally:
            await self._session.close()

    async def _dispatch_due(self) -> None:
        for task_id in await self.store.due_callbacks(time.time(), 100):
            if task_id in self._in_flight or self._slots.locked():
                continue
            self._in_flight.add(task_id)
            await self._slots.acquire()
            delivery = asyncio.create_task(self._deliver(task_id))
            # the loop keeps only weak references to tasks: hold each until it ends
            self._deliveries.add(delivery)
            delivery.add_done_callback(self._deliveries.discard)

    def payload(self, task: Task, cb: dict[str, Any]) -> dict[str, Any]:
        event = cb["event"]
        download_url = None
        if event["has_result"] and event["expire_at"]:
            expires = int(event["expire_at"])
            path = self.links.path.format(task_id=task.task_id)
            download_url = f"{self.links.base_url.rstrip('/')}{path}?expires={expires}&sig=" \
                           f"{self.signer.sign(task.task_id, expires)}"
        return {
            "task_id": task.task_id, "status": event["status"], "download_url": download_url,
            "expire_at": rfc3339(event["expire_at"]) if event["expire_at"] else None,
            "error": event["error"], "attempt": event["attempt"], "callback_seq": cb["seq"],
        }

    async def _deliver(self, task_id: str) -> None:
        try:
            task = await self.store.get(task_id)
            if task is None or task.callback is None or task.callback_url is None:
                return
            cb = task.callback
            error, final = await self._try(task, cb)
            await self.store.update(task_id, lifecycle.callback_attempted(cb["seq"], error,
                                                                          self.config.retry_delays_sec, final))
            outcome = "delivered" if error is None else ("failed" if final else "will retry")
            log.info(f"callback {outcome}", extra={"task_id": task_id, "callback_seq": cb["seq"],
                                                    "try": cb["attempts"] + 1, "error": error})
        except Exception:
            log.exception("callback delivery crashed", extra={"task_id": task_id})
        finally:
            self._in_flight.discard(task_id)
            self._slots.release()

    async def _try(self, task: Task, cb: dict[str, Any]) -> tuple[str | None, bool]:
        """(why it failed or None, whether that is final)."""
        url = task.callback_url or ""
        reason = await refusal(url, self.policy)
        if reason is not None:
            return f"refused: {reason}", True
        secrets = self.config.secrets_for(task.tenant)
        if not secrets:
            return "no webhook secret is configured for this tenant", True
        body = json.dumps(self.payload(task, cb), separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "user-agent": "export-backend-callbacks/1"}
        headers |= webhooks.sign(secrets, cb["webhook_id"], body)
        if traceparent := task.extra.get("traceparent"):
            headers["traceparent"] = traceparent
        assert self._session is not None
        try:
            async with self._session.post(url, data=body, headers=headers, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=self.config.timeout_sec)) as resp:
                await resp.read()
                if 200 <= resp.status < 300:
                    return None, False
                return f"the receiver answered {resp.status}", resp.status == 410
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"[:300], False
