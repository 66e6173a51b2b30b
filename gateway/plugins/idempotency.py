"""idempotency: `Idempotency-Key` makes a submit safe to repeat, exactly once by construction.

Keys are scoped per tenant and route. The first request claims the key, and the
claim fixes the task id: it is stored with the claim and put on the request
context (`ctx.task_id`), where the `task_id` plugin takes it instead of minting
one. Whatever happens afterwards, every request with this key sends that same id
upstream, and the backend's create is idempotent by id, so one key can never
create two tasks.

A claim has an owner, a fencing token and a short lease (`claim_ttl_sec`) that
its request renews while it runs. A claim whose owner died, or that was
released after a failure, is taken over by the next request with the key: same
task id, token + 1. Every write to the record is a compare-and-set on the bytes
the writer last saw, so a stale owner (or a write that sat in a stalled socket)
can never overwrite a newer claim. docs/design/idempotency-under-failures.md walks through each point of failure.

Repeats: same body and a stored answer → that answer with `Idempotent-Replayed:
true`; another body → 422; a live claim → 409 with `Retry-After`. A tenant holds
at most `max_keys_per_tenant` keys (429 beyond it; the oldest expire first).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from pydantic import Field
from redis.exceptions import RedisError

from exports_common.body_bounds import AnswerBytes, BodyBytes
from exports_common.errors import ApiError, ErrorKind, validation_error
from exports_common.task_ids import PREFIX_PATTERN, new_task_id
from gateway.context import Handler, RequestContext
from gateway.kv import KeyValue
from gateway.plugins.base import Contract, PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services
from gateway.telemetry import Tally

log = logging.getLogger("gateway.idempotency")
_KEPT_HEADERS = ("content-type", "location", "retry-after", "x-gateway-attempts")
# one per process: a claim names the gateway process that holds it
OWNER = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class IdempotencySettings(Settings):
    header: str = "Idempotency-Key"
    ttl_sec: int = Field(86_400, ge=1, le=7 * 86_400, description="how long a key, its task id and answer are kept")
    claim_ttl_sec: float = Field(5.0, gt=0, le=60, description="a claim not renewed for this long (its gateway "
                                                               "died) is taken over by the next request")
    task_id_prefix: str = Field("exp", pattern=PREFIX_PATTERN.pattern,
                                description="of the task id fixed at claim time; the same as the route's task_id")
    max_keys_per_tenant: int = Field(200_000, ge=1, description="beyond it a new key gets 429 until old ones expire")
    max_stored_answer_bytes: AnswerBytes = Field(65_536, ge=0, description="a bigger answer is kept only as its hash")
    max_body_bytes: BodyBytes = Field(65_536, ge=64, description="used only when no earlier plugin read the body")


@dataclass(frozen=True)
class Claim:
    fp: str
    task_id: str
    owner: str
    token: int
    until: float  # wall clock: gateways sharing a store keep their clocks within a fraction of claim_ttl_sec
    state: str = "claimed"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def _valid_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and all(33 <= ord(c) <= 126 for c in key)


def _fingerprint(ctx: RequestContext, body: bytes) -> str:
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:
        canonical = body
    return hashlib.sha256(ctx.method.encode() + b" " + ctx.upstream_path.encode() + b"\n" + canonical).hexdigest()


class _Held:
    """The claim this request holds, as the bytes last written, kept fresh until the answer is stored."""

    def __init__(self, store: KeyValue, key: str, claim: Claim, raw: bytes, ttl_sec: int, lease_sec: float) -> None:
        self.store, self.key, self.claim, self.raw = store, key, claim, raw
        self.ttl_sec, self.lease_sec = ttl_sec, lease_sec
        self.lost = False
        self._stop = asyncio.Event()
        self._renewer = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while not await _wait(self._stop, self.lease_sec / 3):
            claim = Claim(self.claim.fp, self.claim.task_id, OWNER, self.claim.token, time.time() + self.lease_sec)
            try:
                if not await _write(self.store, self.key, self.raw, claim.encode(), self.ttl_sec):
                    self.lost = True  # taken over: the new owner sends the same task id, so nothing is duplicated
                    return
            except RedisError:
                continue  # a stall: try again; the lease may lapse, and a takeover is still safe
            self.claim, self.raw = claim, claim.encode()

    async def settle(self, record: bytes | None) -> None:
        """Stop renewing, then store the answer (`record`) or release the claim for an immediate takeover."""
        self._stop.set()
        await self._renewer
        if self.lost:
            return
        if record is None:
            released = Claim(self.claim.fp, self.claim.task_id, OWNER, self.claim.token, 0.0)
            record = released.encode()
        try:
            await _write(self.store, self.key, self.raw, record, self.ttl_sec)
        except RedisError as exc:
            # the claim lapses by itself within its lease; a retry then sends the same task id
            log.warning("idempotency record not stored; a retry will re-send the same task id",
                        extra={"error": str(exc)})


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _write(store: KeyValue, key: str, expected: bytes | None, value: bytes, ttl: float) -> bool:
    """Compare-and-set; a write whose answer was lost but that did land counts as done (values are unique)."""
    if expected is None:
        written = await store.add(key, value, ttl)
    else:
        written = await store.replace(key, expected, value, ttl)
    return written or await store.get(key) == value


def _store(services: Services) -> KeyValue:
    # a key must outlive a restart (its task may exist): durable, in its own table
    return services.state.kv("idem", durable=True, table="idempotency")


def _outcomes(services: Services) -> Tally:
    return services.metrics.tally("gateway_idempotency", ("route", "result"), "idempotency-key outcomes")


class Idempotency(PluginBase[IdempotencySettings]):
    name: ClassVar[str] = "idempotency"
    Settings: ClassVar[type[IdempotencySettings]] = IdempotencySettings

    def __init__(self, next: Handler, settings: IdempotencySettings, services: Services, route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        self.store = _store(services)
        self.outcomes = _outcomes(services)

    @classmethod
    def contract(cls, settings: IdempotencySettings, methods: tuple[str, ...]) -> Contract:
        # keys are per tenant, so the tenant must be known (auth before it), else two tenants' keys would be one;
        # it fixes the task id at claim time: a plugin that mints one when none is set must come after it
        return Contract(needs=frozenset({"tenant"}), provides=frozenset({"task_id"}),
                        agrees=(("task_id_prefix", settings.task_id_prefix),))

    @classmethod
    async def stats(cls, services: Services) -> dict[str, Any]:
        return {"idempotency_keys": _store(services).size()}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        key = ctx.headers.get(self.settings.header)
        if key is None:
            return await self.next(ctx)
        if not _valid_key(key):
            raise validation_error(self.settings.header, "must be 1 to 255 printable ASCII characters")
        fingerprint = _fingerprint(ctx, await ctx.read_body(self.settings.max_body_bytes))
        tenant = "{" + (ctx.tenant or "-") + "}"  # a hash tag: one tenant's keys share a Redis Cluster slot
        store_key = f"{tenant}:{self.route}:{key}"
        for _ in range(3):
            raw = await self.store.get(store_key)
            if raw is None:
                await self._reserve(f"{tenant}:~keys", store_key)
                claim = self._claim(fingerprint, new_task_id(self.settings.task_id_prefix), 1)
            else:
                record = json.loads(raw)
                answer = self._repeat(record, fingerprint)
                if answer is not None:
                    return answer
                self.outcomes.add(self.route, "taken_over")
                # a claim written before claims held task ids has none: it gets one now
                task_id = record.get("task_id") or new_task_id(self.settings.task_id_prefix)
                claim = self._claim(fingerprint, task_id, record.get("token", 0) + 1)
            if await _write(self.store, store_key, raw, claim.encode(), self.settings.ttl_sec):
                return await self._first(ctx, store_key, claim)
        raise ApiError(ErrorKind.IDEMPOTENCY_IN_FLIGHT, headers={"Retry-After": "1"})

    def _claim(self, fingerprint: str, task_id: str, token: int) -> Claim:
        return Claim(fingerprint, task_id, OWNER, token, time.time() + self.settings.claim_ttl_sec)

    async def _reserve(self, index: str, store_key: str) -> None:
        if not await self.store.reserve(index, store_key, self.settings.ttl_sec, self.settings.max_keys_per_tenant):
            self.outcomes.add(self.route, "quota")
            raise ApiError(ErrorKind.IDEMPOTENCY_QUOTA, data={"max_keys": self.settings.max_keys_per_tenant},
                           headers={"Retry-After": "60"})

    async def _first(self, ctx: RequestContext, store_key: str, claim: Claim) -> GatewayResponse:
        ctx.task_id = claim.task_id
        held = _Held(self.store, store_key, claim, claim.encode(), self.settings.ttl_sec, self.settings.claim_ttl_sec)
        try:
            resp = await self.next(ctx)
        except BaseException:
            await asyncio.shield(held.settle(None))
            raise
        if resp.status >= 500 or resp.status == 429:  # a refusal for now is no answer to replay later
            await held.settle(None)
            return resp
        try:
            body = await resp.read()
        except BaseException:  # an answer past the route's bound, a body cut short: nothing to replay
            await asyncio.shield(held.settle(None))
            raise
        await held.settle(self._record(claim, resp, body))
        self.outcomes.add(self.route, "stored")
        return resp

    def _record(self, claim: Claim, resp: GatewayResponse, body: bytes) -> bytes:
        record: dict[str, Any] = {
            "state": "done", "fp": claim.fp, "task_id": claim.task_id, "status": resp.status,
            "headers": [(k, v) for k, v in resp.headers if k in _KEPT_HEADERS],
        }
        if len(body) <= self.settings.max_stored_answer_bytes:
            record["body"] = base64.b64encode(body).decode()
        else:
            record["body_sha256"] = hashlib.sha256(body).hexdigest()
        return json.dumps(record).encode()

    def _repeat(self, record: dict[str, Any], fingerprint: str) -> GatewayResponse | None:
        """The answer to a repeat, or None when the claim is free to take over."""
        if record["fp"] != fingerprint:
            self.outcomes.add(self.route, "mismatch")
            raise ApiError(ErrorKind.IDEMPOTENCY_KEY_REUSED, data={"field": self.settings.header})
        if record["state"] != "done":
            if record.get("until", 0.0) <= time.time():
                return None
            self.outcomes.add(self.route, "in_flight")
            # the first request usually ends well before its lease would lapse: ask again soon
            raise ApiError(ErrorKind.IDEMPOTENCY_IN_FLIGHT, headers={"Retry-After": "1"})
        self.outcomes.add(self.route, "replayed")
        headers = [(k, v) for k, v in record["headers"]] + [("idempotent-replayed", "true")]
        if "body" in record:
            return GatewayResponse(record["status"], headers, base64.b64decode(record["body"]))
        resp = GatewayResponse.envelope({"task_id": record.get("task_id"), "body_sha256": record["body_sha256"]},
                                        status=record["status"])
        for name, value in headers:
            if name != "content-type":
                resp.set_header(name, value)
        return resp
