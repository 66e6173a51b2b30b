"""idempotency: `Idempotency-Key` makes a submit safe to repeat (CONTRACT 2.1).

Keys are scoped per tenant and route. The first request takes the key with an
atomic add; a repeat with the same body gets the stored answer with
`Idempotent-Replayed: true`, a repeat with another body 422, a repeat while the
first is still running 409. An answer of 5xx or an error frees the key, so the
client can try again.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, ClassVar

from pydantic import Field

from exports_common.errors import ApiError, ErrorKind, validation_error
from exports_common.json_body import read_limited
from gateway.context import Handler, RequestContext
from gateway.plugins.base import Settings
from gateway.response import GatewayResponse
from gateway.services import Services

_KEPT_HEADERS = ("content-type", "location", "retry-after", "x-gateway-attempts")


class IdempotencySettings(Settings):
    header: str = "Idempotency-Key"
    ttl_sec: int = Field(86_400, ge=1, le=7 * 86_400, description="how long a key and its answer are kept")
    in_flight_ttl_sec: float = Field(60.0, gt=0, description="a key held by a request that never ended frees itself")
    max_body_bytes: int = Field(65_536, ge=64, description="used only when no earlier plugin read the body")


def _valid_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and all(33 <= ord(c) <= 126 for c in key)


def _fingerprint(ctx: RequestContext, body: bytes) -> str:
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except ValueError:
        canonical = body
    return hashlib.sha256(ctx.method.encode() + b" " + ctx.upstream_path.encode() + b"\n" + canonical).hexdigest()


class Idempotency:
    name: ClassVar[str] = "idempotency"
    Settings: ClassVar[type[IdempotencySettings]] = IdempotencySettings

    def __init__(self, next: Handler, settings: IdempotencySettings, services: Services, route: str) -> None:
        self.next = next
        self.settings = settings
        self.store = services.idempotency_store
        self.metrics = services.metrics
        self.route = route

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        key = ctx.request.headers.get(self.settings.header)
        if key is None:
            return await self.next(ctx)
        if not _valid_key(key):
            raise validation_error(self.settings.header, "must be 1 to 255 printable ASCII characters")
        if ctx.body is None:
            ctx.body = await read_limited(ctx.request.stream(), self.settings.max_body_bytes,
                                          ctx.request.headers.get("content-length"))
        fingerprint = _fingerprint(ctx, ctx.body)
        store_key = f"{ctx.tenant or '-'}:{self.route}:{key}"
        claim = json.dumps({"state": "in_flight", "fp": fingerprint}).encode()
        for _ in range(3):
            if await self.store.add(store_key, claim, self.settings.in_flight_ttl_sec):
                return await self._first(ctx, store_key, fingerprint)
            existing = await self.store.get(store_key)
            if existing is not None:
                return self._repeat(json.loads(existing), fingerprint)
        raise ApiError(ErrorKind.IDEMPOTENCY_IN_FLIGHT, headers={"Retry-After": "1"})

    async def _first(self, ctx: RequestContext, store_key: str, fingerprint: str) -> GatewayResponse:
        try:
            resp = await self.next(ctx)
        except BaseException:
            await self.store.delete(store_key)
            raise
        if resp.status >= 500 or resp.status == 429:  # a refusal for now is no answer to replay later
            await self.store.delete(store_key)
            return resp
        body = await resp.read()
        record = {
            "state": "done", "fp": fingerprint, "status": resp.status,
            "headers": [(k, v) for k, v in resp.headers if k in _KEPT_HEADERS],
            "body": base64.b64encode(body).decode(),
        }
        await self.store.set(store_key, json.dumps(record).encode(), self.settings.ttl_sec)
        self.metrics.idempotency.add(self.route, "stored")
        return resp

    def _repeat(self, record: dict[str, Any], fingerprint: str) -> GatewayResponse:
        if record["fp"] != fingerprint:
            self.metrics.idempotency.add(self.route, "mismatch")
            raise ApiError(ErrorKind.IDEMPOTENCY_KEY_REUSED, data={"field": self.settings.header})
        if record["state"] != "done":
            self.metrics.idempotency.add(self.route, "in_flight")
            raise ApiError(ErrorKind.IDEMPOTENCY_IN_FLIGHT, headers={"Retry-After": "1"})
        self.metrics.idempotency.add(self.route, "replayed")
        headers = [(k, v) for k, v in record["headers"]] + [("idempotent-replayed", "true")]
        return GatewayResponse(record["status"], headers, base64.b64decode(record["body"]))
