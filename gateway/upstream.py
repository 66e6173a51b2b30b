"""The upstream client's interface (the gateway's hot path), its failures, and EndpointPool.

The client is gateway/http_client.py, written for this gateway on httptools' parser: a
pooled GET cost ~296,000 instructions through aiohttp's session, ~95,000 through it
(docs/libraries.md). Failures reach the plugins as
UpstreamError with a kind the retry, breaker and outlier detection understand:
connect_error (no connection), timeout, reset (the connection failed after it was
made), circuit_open (a breaker refused).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

if TYPE_CHECKING:  # the response module reads this one's errors
    from gateway.response import GatewayResponse

FailureKind = Literal["connect_error", "timeout", "reset", "circuit_open"]


class Timeouts(NamedTuple):  # a tuple: made per try, quicker to build than a frozen dataclass
    connect: float = 2.0
    read: float = 30.0
    # the monotonic time by which a try must have the head of its answer (a route's total time), if any
    deadline: float | None = None


class FeedSettings(NamedTuple):
    """An upstream's change feed (config: upstreams.<name>.change_feed)."""

    path: str
    silence_sec: float
    reprobe_sec: float


class UpstreamError(Exception):
    """The upstream gave no usable answer; `retry_after` says when trying again makes sense."""

    def __init__(self, kind: FailureKind, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.retry_after = retry_after


class AnswerTooLarge(UpstreamError):
    """An answer read whole passed its bound (a route's `max_answer_bytes`): its connection is closed."""

    def __init__(self, limit: int) -> None:
        super().__init__("reset", f"the upstream's answer passed {limit} bytes, the most this route reads whole")
        self.limit = limit


# the most of an answer read whole (to sign its links, cache it, store it), unless a route says otherwise
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024

Body = bytes | AsyncIterable[bytes] | None


class UpstreamClient(Protocol):
    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body, timeouts: Timeouts
    ) -> GatewayResponse: ...

    def resize(self, pool_sizes: dict[str, int]) -> None:
        """Bound each origin's connections anew (a config reload); an origin not named keeps the default."""

    async def close(self) -> None: ...


Balance = Literal["round_robin", "least_requests"]


@dataclass(frozen=True)
class OutlierPolicy:
    """Passive health, after Envoy's outlier detection: consecutive connect failures eject an endpoint."""

    consecutive_connect_failures: int = 3
    base_ejection_sec: float = 10.0
    max_ejection_sec: float = 300.0


@dataclass
class Endpoint:
    url: str
    in_flight: int = 0
    failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0


class EndpointPool:
    """One upstream's endpoints: which one the next call goes to, and which are resting.

    An endpoint that fails to connect `consecutive_connect_failures` times in a row is left out
    for `base_ejection_sec` times the number of its ejections so far (capped), so one that keeps
    dying rests longer each time; a call that connects clears its count. When every endpoint is
    ejected, the one that comes back soonest is used anyway: a guess beats refusing outright.
    """

    def __init__(self, urls: list[str], balance: Balance, policy: OutlierPolicy,
                 on_eject: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.balance = balance
        self.policy = policy
        self.on_eject = on_eject
        self.clock = clock
        self._next = 0

    def pick(self) -> Endpoint:
        if len(self.endpoints) == 1:  # healthy or not, it is the one (the per-call list below is for several)
            return self.endpoints[0]
        now = self.clock()
        healthy = [e for e in self.endpoints if e.ejected_until <= now]
        if not healthy:
            return min(self.endpoints, key=lambda e: e.ejected_until)
        if self.balance == "least_requests":
            fewest = min(e.in_flight for e in healthy)
            healthy = [e for e in healthy if e.in_flight == fewest]
        self._next += 1
        return healthy[self._next % len(healthy)]

    def connected(self, endpoint: Endpoint) -> None:
        """A call reached it: its failure count clears, and one used while ejected is back at once."""
        endpoint.failures = 0
        if not endpoint.ejected_until and not endpoint.ejections:  # never ejected: nothing to clear
            return
        if endpoint.ejected_until > self.clock():
            endpoint.ejected_until = 0.0
        else:
            endpoint.ejections = 0

    def connect_failed(self, endpoint: Endpoint) -> None:
        endpoint.failures += 1
        if endpoint.failures < self.policy.consecutive_connect_failures:
            return
        endpoint.failures = 0
        endpoint.ejections += 1
        rest = min(self.policy.base_ejection_sec * endpoint.ejections, self.policy.max_ejection_sec)
        endpoint.ejected_until = self.clock() + rest
        if self.on_eject is not None:
            self.on_eject(endpoint.url)

    def ejected(self) -> list[str]:
        now = self.clock()
        return [e.url for e in self.endpoints if e.ejected_until > now]
