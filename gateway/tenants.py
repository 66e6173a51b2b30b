"""API keys to tenants, and what each tenant may do. Keys are stored only as SHA-256 hashes ("sha256:<hex>")."""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

from gateway.context import RequestContext
from gateway.limiter import Quota
from gateway.refusal_hold import HoldSettings


def hash_key(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class TenantLimits:
    requests: Quota
    submits: Quota
    max_active_tasks: int
    max_outbox_entries: int
    max_open_streams: int = 1000


@dataclass(frozen=True)
class Limits:
    by_tenant: dict[str, TenantLimits] = field(default_factory=dict)
    per_address: Quota = field(default_factory=lambda: Quota(20, 50))
    gateway_processes: int = 1
    hold: HoldSettings = field(default_factory=HoldSettings)


# `Bearer <key>` as clients send it: the one spelling the memo keeps, so its entries are the configured keys at most
_CANONICAL = re.compile(rb"Bearer [^\s]+")


class _NoTenant(LookupError):
    """An `Authorization` value that names no tenant: raised, so that the memo keeps nothing of it."""


class TenantDirectory:
    def __init__(self, key_hashes: dict[str, list[str]], limits: Limits | None = None) -> None:
        self._by_hash = {h.lower(): tenant for tenant, hashes in key_hashes.items() for h in hashes}
        # `Authorization` values in the canonical spelling seen to name a tenant, so that a client's key is hashed
        # once, not on each request: a value that names none raises, which lru_cache does not keep, so only keys
        # that matched stay, one entry per configured key at most: what clients send never sets its size nor
        # pushes another tenant's entry out (a reload builds a new directory, and a new memo)
        self._named = functools.lru_cache(maxsize=len(self._by_hash))(self._tenant_named)
        self.limits = limits or Limits()

    def lookup(self, api_key: str) -> str | None:
        # by hash: its timing tells nothing about the key itself
        return self._by_hash.get(hash_key(api_key))

    def bearer(self, authorization: bytes) -> str | None:
        """The tenant an `Authorization: Bearer <key>` header's value names, or None."""
        try:
            if _CANONICAL.fullmatch(authorization):
                return self._named(authorization)
            return self._tenant_named(authorization)  # another spelling: read, never kept
        except _NoTenant:
            return None

    def _tenant_named(self, authorization: bytes) -> str:
        scheme, _, key = authorization.decode("latin-1").partition(" ")
        tenant = self.lookup(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise _NoTenant
        return tenant

    def caller(self, ctx: RequestContext) -> str | None:
        """The tenant the request's Authorization header names; the key is hashed once per request at most."""
        if not ctx.caller_resolved:
            header = ctx.header_values.get(b"authorization")
            ctx.caller = self.bearer(header) if header else None
            ctx.caller_resolved = True
        return ctx.caller

    def limits_of(self, tenant: str) -> TenantLimits:
        return self.limits.by_tenant[tenant]
