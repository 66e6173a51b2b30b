"""One way to open Redis for both processes: bounded waits, retried reconnects, checked pooled connections.

redis-py's defaults wait on a stalled server for as long as the socket lets them
and hand a connection the server closed (after a restart) to the next command,
which then fails. Here every command waits at most `socket_timeout`, a connection
error or timeout is retried once after a short backoff on a fresh connection (a
restarted server's stale connections cost nothing), and a connection idle for 5 s
is pinged before use. A fresh connection sends no client-name handshake, so a
stalled server costs a request a few socket timeouts at most: about 2 s with the
default 0.5 s, well inside any route's timeout.

A URL `redis+cluster://HOST:PORT` (or `rediss+cluster://`) names any node of a Redis
Cluster: the client learns the others from it and sends each command to the node
owning its key's slot. Every key both processes write is hash-tagged so that a
script or transaction touches one slot (docs/operations/several-nodes.md, *Redis Cluster*).
"""
from __future__ import annotations

from typing import Any, TypeAlias

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from exports_common.errors import ApiError, unavailable

RETRY_AFTER_SEC = 2
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# what both processes hold: one server or a cluster, used through the commands they share
AnyRedis: TypeAlias = "Redis | RedisCluster"


def connect(url: str, *, socket_timeout: float = 0.5, decode_responses: bool = False) -> AnyRedis:
    options: dict[str, Any] = {
        "decode_responses": decode_responses, "socket_timeout": socket_timeout, "socket_connect_timeout": 0.5,
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.05), retries=1),
        "retry_on_error": [ConnectionError, TimeoutError], "health_check_interval": 5,
        "driver_info": None,  # no CLIENT SETINFO: one round trip less per new connection
    }
    scheme, _, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}", **options)
    return Redis.from_url(url, **options)


def store_unavailable(exc: RedisError) -> ApiError:
    """What a request answers when Redis failed under it: 503, try again shortly."""
    return unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                       data={"reason": "store_unavailable"})
