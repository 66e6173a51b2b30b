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

redis-py's cluster transaction retries its WATCH, its commands between WATCH and MULTI and its
MULTI/EXEC with the client's `retry`, each on another connection after a connection error.
Two things go wrong there, both mended here through that `retry` (a `_TransactionRetry`,
told by the transaction what it is sending):
- the retry takes the node's next pooled connection: after the node restarted (a restart
  quicker than the health check), as closed by the server as the first, so the first
  transactions after it failed while the node answered again. A transaction's first command
  (its WATCH, or the MULTI/EXEC of one without) meeting a closed connection now drops the
  node's older connections first, as redis-py's command path does for a plain command;
- WATCH holds on its connection only: a command after it, or the MULTI/EXEC, sent again on
  another connection is no longer checked, and redis-py sends it again without the WATCH, so
  an update could be applied over another's write. Once a transaction's WATCH is sent, nothing
  is sent again: a connection lost under a read after it fails the transaction with a
  WatchError and resets the pipeline, as redis-py's one-server pipeline does (the caller's loop
  watches and reads again: nothing was written); one lost under its MULTI/EXEC is raised as the
  connection error it is, since the EXEC may have been applied and a caller's loop would apply
  its change a second time.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterError,
    ConnectionError,
    MaxConnectionsError,
    RedisClusterException,
    RedisError,
    WatchError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from exports_common.errors import ApiError, unavailable

RETRY_AFTER_SEC = 2
# connections a process keeps to one Redis server (per node of a cluster): a gateway process with hundreds of
# requests under way, each with a command out (a rate-limit check, a cache read), needs as many
MAX_CONNECTIONS = 1024
# a pooled connection idle this long is pinged before its next command
HEALTH_CHECK_SEC = 5
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# how long a start waits for a cluster to name its nodes before serving
LEARN_CLUSTER_SEC = 2.0

log = logging.getLogger("exports_common.redis_client")

# what both processes hold: one server or a cluster, used through the commands they share
AnyRedis: TypeAlias = "Redis | RedisCluster"
T = TypeVar("T")


@dataclass(frozen=True)
class _Sending:
    """What a cluster transaction is sending: its first command, or one after its WATCH (a read, or the
    MULTI/EXEC itself: `applies`), to the node that owns `key`'s slot when it watched one."""
    cluster: RedisCluster
    watched: bool
    applies: bool
    key: Any = None


_SENDING: ContextVar[_Sending | None] = ContextVar("cluster_transaction_sending", default=None)


# connection errors that say nothing of the connections already open: a pool at its bound, a refused login
_NOT_STALE = (MaxConnectionsError, AuthenticationError, AuthorizationError)


async def _drop_stale(sending: _Sending, error: Exception) -> None:
    """After a connection error, the node's older connections (closed by a restart, as the failed one was)
    reconnect before another is used; what redis-py's command path does for a plain command. The node is the
    one redis-py names the failed connection of, else the one owning the key the transaction watched, else
    (it watched none) every node's, idle ones reconnecting when next used (a rare error: a node's restart)."""
    if isinstance(error, _NOT_STALE):
        return
    cluster = sending.cluster
    connection = getattr(error, "connection", None)
    if isinstance(connection, Connection):
        node = cluster.get_node(host=connection.host, port=connection.port)
    else:
        node = cluster.get_node_from_key(sending.key) if sending.key is not None else None
    for stale in [node] if node is not None else cluster.get_nodes():
        stale.update_active_connections_for_reconnect()
        await stale.disconnect_free_connections()


class _TransactionRetry(Retry):
    """The cluster client's retry, which redis-py's cluster transactions copy and retry their sends with;
    its plain commands and non-transactional pipelines only read its number of retries."""

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
                              is_retryable: Callable[[Exception], bool] | None = None,
                              with_failure_count: bool = False) -> T:
        sending = _SENDING.get()
        if sending is None:
            return await super().call_with_retry(do, fail, is_retryable, with_failure_count)

        async def failed(error: Exception, *count: int) -> None:
            await fail(error, *count)  # redis-py's own: the failed connection is dropped and released
            if sending.watched and sending.applies:  # the EXEC may have been applied: not a conflict to retry
                raise error
            if sending.watched:  # sent again, it would go on a connection without the WATCH
                raise WatchError(f"A {type(error).__name__} occurred while watching one or more keys") from error
            if isinstance(error, ConnectionError):
                await _drop_stale(sending, error)

        return await super().call_with_retry(do, failed, is_retryable, with_failure_count)


async def _sent_as(sending: _Sending, send: Awaitable[T]) -> T:
    token = _SENDING.set(sending)
    try:
        return await send
    finally:
        _SENDING.reset(token)


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
        return _Pipeline(self, bool(transaction))  # type: ignore[abstract]  # as redis-py makes its own ClusterPipeline


class _Pipeline(ClusterPipeline):
    def __init__(self, client: RedisCluster, transaction: bool) -> None:
        super().__init__(client, transaction)
        self.transaction = transaction
        self.watched = False  # a transaction whose WATCH was sent: its connection holds it until EXEC or reset
        self.key: Any = None  # the first key it watched: every key of a transaction is in that key's slot

    async def _send(self, send: Awaitable[T], watched: bool, applies: bool = False) -> T:
        try:
            return await _sent_as(_Sending(self.cluster_client, watched, applies, self.key), send)
        except WatchError:
            await self.reset()  # as the one-server pipeline: the caller's next WATCH starts afresh
            raise

    async def watch(self, *names: Any) -> None:  # type: ignore[override]  # async, as ClusterPipeline's
        if self.key is None and names:
            self.key = names[0]
        send = super().watch(*names)  # type: ignore[no-untyped-call]
        watched, self.watched = self.watched, True  # from now on its sends go once (a reset clears it)
        await self._send(send, watched)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        queued_or_sent = super().execute_command(*args, **kwargs)
        if isinstance(queued_or_sent, Coroutine):  # sent at once: a command between WATCH and MULTI
            return self._send(queued_or_sent, self.watched)
        return queued_or_sent

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            if self.transaction:
                return await self._send(super().execute(raise_on_error, allow_redirections), self.watched,
                                        applies=True)
            return await super().execute(raise_on_error, allow_redirections)
        except RedisError:
            raise
        except Exception as exc:
            raise _slipped(exc) from exc

    async def reset(self) -> None:  # type: ignore[override]  # ClusterPipeline's, not the RESET command's
        self.watched, self.key = False, None
        await super().reset()  # type: ignore[no-untyped-call]

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # a slip of redis-py's inside the `async with` block (WATCH, an immediate read) leaves it as a ClusterError
        try:
            await self.reset()  # what ClusterPipeline.__aexit__ does
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
        "retry_on_error": [ConnectionError, RedisTimeoutError], "health_check_interval": HEALTH_CHECK_SEC,
        "driver_info": None,  # no CLIENT SETINFO: one round trip less per new connection
    }
    scheme, _, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        options["retry"] = _TransactionRetry(ExponentialBackoff(cap=0.25, base=0.05), retries=1)
        return _Cluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}", **options)
    # a command finding every connection busy waits for one up to the socket timeout (redis-py's own pool fails it)
    return Redis.from_pool(BlockingConnectionPool.from_url(url, timeout=socket_timeout, **options))


async def learn_cluster(client: AnyRedis) -> None:
    """A cluster client learns the cluster's nodes and slots now, at the process's start: redis-py learns them
    on the first command, and of a burst of first commands at once (a process's first requests) some fail
    with a ConnectionError. A cluster not reachable yet is learnt on a later command, as before; one server
    has nothing to learn."""
    if not isinstance(client, RedisCluster):
        return
    try:
        async with asyncio.timeout(LEARN_CLUSTER_SEC):
            await client.initialize()
    except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        log.warning("the Redis Cluster did not name its nodes at the start; its first commands will ask again",
                    extra={"error": repr(exc)})


def store_unavailable(exc: RedisError) -> ApiError:
    """What a request answers when Redis failed under it: 503, try again shortly."""
    return unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                       data={"reason": "store_unavailable"})
