"""One way to open Redis for both processes: bounded waits, retried reconnects, checked pooled connections.

redis-py's defaults wait on a stalled server for as long as the socket lets them
and hand a connection the server closed (after a restart) to the next command,
which then fails. Here every command waits at most `socket_timeout`, a connection
error or timeout is retried once after a short backoff on a fresh connection (a
restarted server's stale connections cost nothing), and a connection idle for 5 s
is pinged before use. A fresh connection sends no client-name handshake, so a
stalled server costs a request a few socket timeouts at most: about 2 s with the
default 0.5 s, well inside any route's timeout.
"""
from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from exports_common.errors import ApiError, unavailable

RETRY_AFTER_SEC = 2


def connect(url: str, *, socket_timeout: float = 0.5, decode_responses: bool = False) -> Redis:
    return Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_timeout=socket_timeout,
        socket_connect_timeout=0.5,
        retry=Retry(ExponentialBackoff(cap=0.25, base=0.05), retries=1),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=5,
        lib_name=None,
        lib_version=None,
    )


def store_unavailable(exc: RedisError) -> ApiError:
    """What a request answers when Redis failed under it: 503, try again shortly."""
    return unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                       data={"reason": "store_unavailable"})
