"""One way to open Redis for both processes: bounded waits, retried reconnects, checked pooled connections.

redis-py's defaults wait on a stalled server for as long as the socket lets them
and hand a connection the server closed (after a restart) to the next command,
which then fails. Here every command waits at most `socket_timeout`, a connection
error or timeout is retried once after a short backoff on a fresh connection (a
restarted server's stale connections cost nothing), and a connection idle for 5 s
is pinged before use. A fresh connection sends no client-name handshake, so a
stalled server costs a request a few socket timeouts at most: about 2 s with the
default 0.5 s, well inside any route's timeout. A process keeps at most MAX_CONNECTIONS
connections; a command that finds them all busy (a storm of requests, each with its own
command out) waits for one up to the socket timeout, where redis-py's own pool would fail it.

A URL `redis+cluster://HOST:PORT` (or `rediss+cluster://`) names any node of a Redis
Cluster: the client learns the others from it and sends each command to the node
owning its key's slot. Every key both processes write is hash-tagged so that a
script or transaction touches one slot (docs/operations/several-nodes.md, *Redis Cluster*).

redis-py's cluster client has let its own slips out while the cluster's topology changes
under it (a failover): an AttributeError on a node it no longer knows (redis/redis-py#3815,
#3835), a RuntimeError from a connection closed under its handshake, and the like. Every
caller here treats a RedisError as Redis failing (a 503, a retry, or a documented
fallback), so anything else raised inside a cluster command or pipeline is raised as a
ClusterError (a RedisError) instead of reaching a caller as a bug.
"""
from __future__ import annotations

from types import TracebackType
from typing import Any, TypeAlias

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterError, ConnectionError, RedisClusterException, RedisError, TimeoutError

from exports_common.errors import ApiError, unavailable

RETRY_AFTER_SEC = 2
# connections a process keeps to one Redis server (per node of a cluster): a gateway process with hundreds of
# requests under way, each with a command out (a rate-limit check, a cache read), needs as many
MAX_CONNECTIONS = 1024
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# what both processes hold: one server or a cluster, used through the commands they share
AnyRedis: TypeAlias = "Redis | RedisCluster"


def _raised_by_redis(exc: BaseException) -> bool:
    """Whether it came out of a call into redis-py (not from the caller's own code inside a pipeline's block)."""
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("redis."):
            return True
        tb = tb.tb_next
    return False


def _slipped(exc: Exception) -> ClusterError:
    return ClusterError(f"the Redis Cluster client failed while the cluster's topology changed: {exc!r}")


class _Cluster(RedisCluster):
    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except RedisError:
            raise
        except Exception as exc:
            raise _slipped(exc) from exc

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _Pipeline(self, transaction)  # type: ignore[abstract]  # as redis-py makes its own ClusterPipeline


class _Pipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except RedisError:
            raise
        except Exception as exc:
            raise _slipped(exc) from exc

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # a slip of redis-py's inside the `async with` block (WATCH, an immediate read) leaves it as a ClusterError
        try:
            await self.reset()  # type: ignore[no-untyped-call]  # what ClusterPipeline.__aexit__ does
        except Exception as failure:  # its UNWATCH on a connection the failure broke: the block's error says more
            if exc is None and isinstance(failure, RedisError):
                raise
            if exc is None:
                raise _slipped(failure) from failure
        if isinstance(exc, Exception) and not isinstance(exc, RedisError) and _raised_by_redis(exc):
            raise _slipped(exc) from exc


def connect(url: str, *, socket_timeout: float = 0.5, decode_responses: bool = False) -> AnyRedis:
    options: dict[str, Any] = {
        "decode_responses": decode_responses, "socket_timeout": socket_timeout, "socket_connect_timeout": 0.5,
        "max_connections": MAX_CONNECTIONS,
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.05), retries=1),
        "retry_on_error": [ConnectionError, TimeoutError], "health_check_interval": 5,
        "driver_info": None,  # no CLIENT SETINFO: one round trip less per new connection
    }
    scheme, _, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return _Cluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}", **options)
    # a command finding every connection busy waits for one up to the socket timeout (redis-py's own pool fails it)
    return Redis.from_pool(BlockingConnectionPool.from_url(url, timeout=socket_timeout, **options))


def store_unavailable(exc: RedisError) -> ApiError:
    """What a request answers when Redis failed under it: 503, try again shortly."""
    return unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                       data={"reason": "store_unavailable"})
