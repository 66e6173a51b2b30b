"""One way to open Redis for both processes: bounded waits, retried reconnects, checked pooled connections.

redis-py's defaults wait on a stalled server for as long as the socket lets them
and hand a connection the server closed (after a restart) to the next command,
which then fails. Here every command waits at most `socket_timeout`, a connection
error or timeout is retried twice with a short exponential backoff on a fresh
connection, and a connection idle for `health_check_interval` is pinged before use.
So a stall costs a request at most about 3 × socket_timeout, and a restart costs
nothing once the server answers again.
"""
from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from exports_common.errors import ApiError, unavailable

RETRY_AFTER_SEC = 2


def connect(url: str, *, socket_timeout: float = 1.0, decode_responses: bool = False) -> "Redis":
    return Redis.from_url(
        url,
        decode_responses=decode_responses,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(1.0, socket_timeout),
        retry=Retry(ExponentialBackoff(cap=0.25, base=0.02), retries=2),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=5,
    )


def store_unavailable(exc: RedisError) -> ApiError:
    """What a request answers when Redis failed under it: 503, try again shortly."""
    return unavailable(f"shared state is unavailable ({type(exc).__name__})", RETRY_AFTER_SEC,
                       data={"reason": "store_unavailable"})
