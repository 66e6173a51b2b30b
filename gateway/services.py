"""Long-lived things the plugins use, built once per process and shared across config reloads."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from exports_common.redis_client import AnyRedis, connect
from exports_common.signing import DownloadSigner
from gateway.breakers import Breakers
from gateway.forwarding import TrustedProxies
from gateway.kv import KeyValue, MemoryKV, RedisKV, SqliteKV
from gateway.limiter import Limiter
from gateway.refusal_hold import RefusalHold
from gateway.telemetry import Metrics, Tracing
from gateway.tenants import TenantDirectory
from gateway.upstream import EndpointPool, FeedSettings, Timeouts, UpstreamClient

T = TypeVar("T")


@dataclass(frozen=True)
class Upstream:
    name: str
    pool: EndpointPool
    timeouts: Timeouts
    feed: FeedSettings | None = None  # its change feed, which event streams follow; None: poll watched tasks
    # sent on every call the gateway makes to it (its service token), whoever asked for the call
    auth: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        """An endpoint's base URL, for callers that do not report connect failures back."""
        return self.pool.pick().url


class State:
    """Where plugins keep state, each under a name of its own: Redis when configured, else in process.

    A store is made once per process and outlives config reloads. `durable` asks for
    a store that survives a restart without Redis (a local SQLite file); otherwise
    memory, for what may be lost.
    """

    def __init__(self, redis: AnyRedis | None, prefix: str, state_dir: str) -> None:
        self.redis = redis  # also for readiness: None when nothing is shared
        self.prefix = prefix
        self.path = Path(state_dir) / "gateway.sqlite3"
        self._made: dict[str, Any] = {}

    def shared(self, name: str, make: Callable[[], T]) -> T:
        """The one object named `name` in this process, made by `make` the first time it is asked for."""
        if name not in self._made:
            self._made[name] = make()
        made: T = self._made[name]
        return made

    def kv(self, name: str, durable: bool = False, table: str | None = None) -> KeyValue:
        """The key-value store `name`: Redis keys `<prefix>:<name>:…`, else SQLite table `table or name` or memory.

        `table`: the SQLite table, when it is not named `name`.
        """
        def make() -> KeyValue:
            if self.redis is not None:
                return RedisKV(self.redis, f"{self.prefix}:{name}:")
            return SqliteKV(self.path, table or name) if durable else MemoryKV()
        return self.shared(f"kv:{name}", make)


def open_redis(url: str) -> AnyRedis | None:
    """The gateway's client: bounded waits, one retry on a fresh connection (see connect)."""
    return connect(url) if url else None


@dataclass
class Services:
    client: UpstreamClient
    metrics: Metrics
    tracing: Tracing
    tenants: TenantDirectory
    signer: DownloadSigner
    upstreams: dict[str, Upstream]
    state: State
    breakers: Breakers
    limiter: Limiter
    refusal_hold: RefusalHold = field(default_factory=RefusalHold)
    public_base_url: str = ""
    trusted_proxies: TrustedProxies = field(default_factory=TrustedProxies)
