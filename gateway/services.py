"""Long-lived things the plugins use, built once per process and shared across config reloads."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exports_common.redis_client import AnyRedis, connect
from exports_common.signing import DownloadSigner
from gateway.breakers import Breakers
from gateway.forwarding import TrustedProxies
from gateway.kv import KeyValue, MemoryKV, RedisKV, SqliteKV
from gateway.limiter import Limiter
from gateway.outbox_store import OutboxStore, RedisOutbox, SqliteOutbox
from gateway.refusal_hold import RefusalHold
from gateway.retry_budget import RetryBudgets
from gateway.telemetry import Metrics, Tracing
from gateway.tenants import TenantDirectory
from gateway.upstream import EndpointPool, Timeouts, UpstreamClient


@dataclass(frozen=True)
class Upstream:
    name: str
    pool: EndpointPool
    timeouts: Timeouts

    @property
    def url(self) -> str:
        """An endpoint's base URL, for callers that do not report connect failures back."""
        return self.pool.pick().url


@dataclass(frozen=True)
class StateStores:
    status_cache: KeyValue
    idempotency: KeyValue
    last_seen: KeyValue
    outbox: OutboxStore
    redis: AnyRedis | None = None  # for readiness: None when nothing is shared


def open_redis(url: str) -> AnyRedis | None:
    """The gateway's client: bounded waits, one retry on a fresh connection (see connect)."""
    return connect(url) if url else None


def open_state(redis: AnyRedis | None, prefix: str, state_dir: str) -> StateStores:
    """Redis when configured; else memory for what may be lost, a local file for what may not."""
    if redis is not None:
        return StateStores(RedisKV(redis, f"{prefix}:cache:"), RedisKV(redis, f"{prefix}:idem:"),
                           RedisKV(redis, f"{prefix}:seen:"), RedisOutbox(redis, prefix), redis)
    path = Path(state_dir) / "gateway.sqlite3"
    return StateStores(MemoryKV(), SqliteKV(path, "idempotency"), MemoryKV(), SqliteOutbox(path))


@dataclass
class Services:
    client: UpstreamClient
    metrics: Metrics
    tracing: Tracing
    tenants: TenantDirectory
    signer: DownloadSigner
    upstreams: dict[str, Upstream]
    state: StateStores
    breakers: Breakers
    limiter: Limiter
    refusal_hold: RefusalHold = field(default_factory=RefusalHold)
    retry_budgets: RetryBudgets = field(default_factory=RetryBudgets)
    public_base_url: str = ""
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)

    @property
    def status_cache(self) -> KeyValue:
        return self.state.status_cache

    @property
    def idempotency_store(self) -> KeyValue:
        return self.state.idempotency

    @property
    def outbox(self) -> OutboxStore:
        return self.state.outbox
