"""Long-lived things the plugins use, built once per process and shared across config reloads."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
from opentelemetry.trace import Tracer

from gateway.kv import KeyValue, MemoryKV, RedisKV, SqliteKV
from gateway.signing import DownloadSigner
from gateway.telemetry import Metrics
from gateway.tenants import TenantDirectory
from gateway.upstream import Timeouts, UpstreamClient


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str
    timeouts: Timeouts


@dataclass
class Services:
    client: UpstreamClient
    metrics: Metrics
    tracer: Tracer
    tenants: TenantDirectory
    signer: DownloadSigner
    upstreams: dict[str, Upstream]
    status_cache: KeyValue
    idempotency_store: KeyValue
    public_base_url: str = ""
    redis: aioredis.Redis | None = None
    stats: dict[str, int] = field(default_factory=dict)


def state_stores(redis: aioredis.Redis | None, prefix: str, state_dir: str) -> tuple[KeyValue, KeyValue]:
    """(status cache, idempotency keys): Redis when configured; else memory and a local file."""
    if redis is not None:
        return RedisKV(redis, f"{prefix}:cache:"), RedisKV(redis, f"{prefix}:idem:")
    return MemoryKV(), SqliteKV(Path(state_dir) / "gateway.sqlite3", "idempotency")
