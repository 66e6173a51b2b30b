"""Circuit breakers: one per upstream, shared by every route and tenant, and one per tenant.

The rule that keeps one tenant from opening the shared breaker for everyone:
- transport failures (connect errors, resets, timeouts) count toward the upstream's
  shared breaker: they say the upstream is unwell, whoever's request met them;
- a failure status (5xx) counts toward the calling tenant's own breaker, and toward
  the shared breaker only while at least two tenants have seen one within
  `window_sec`: one tenant's input making the backend fail is that tenant's problem;
- but a status saying the upstream cannot serve now (502, 503, 504: "unavailable", not
  "your request failed") is everyone's fault unless shown otherwise: it counts toward
  the tenant's own breaker only while another tenant's call succeeded within
  `window_sec`. A backend answering 503 to everyone (its store is down) is a shared
  fault, never a tenant's, even while one tenant alone is calling: that tenant's submits
  are then outboxed, not refused as its own;
- a tenant whose requests alone keep failing gets its own open state (its own 503
  with Retry-After, listed in /admin/breakers) and nobody else notices;
- calls with no tenant count as one tenant, `-`; on a breaker with no tenant to isolate
  (`direct`: a tenant-less route's own) a failure status counts toward it as a
  transport failure does.

Each breaker is a small state machine of its own: closed (counting consecutive
failures), open (refusing until `reset_timeout` has passed), half-open (exactly one
trial call; its answer closes or reopens it). The answer is awaited first and then
recorded; a call that says nothing about a breaker (a cancelled request, a tenant's
5xx for the shared one, a transport failure for the tenant's) is not recorded at all.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Coroutine, Literal

from exports_common.errors import unavailable
from gateway.response import GatewayResponse
from gateway.telemetry import Metrics
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.breaker")
State = Literal["closed", "half-open", "open"]
STATES: dict[str, int] = {"closed": 0, "half-open": 1, "open": 2}
ANONYMOUS = "-"  # calls with no tenant (signed downloads) count as one tenant, with one tenant's breaker
# statuses in which the upstream (or a proxy in front of it) says it cannot serve now, whoever asks
UNAVAILABLE = frozenset({502, 503, 504})
_TRIALS: set[asyncio.Future[GatewayResponse]] = set()


class Breaker:
    def __init__(self, name: str, fail_max: int, reset_timeout: float, metrics: Metrics,
                 window_sec: float = 10.0, tenant: str | None = None) -> None:
        self.name = name
        self.fail_max = fail_max
        self.reset_timeout = reset_timeout
        self.metrics = metrics
        self.tenant = tenant
        self.window_sec = window_sec
        self.state: str = "closed"  # a State
        self.failures = 0  # consecutive, while closed
        self.opened_at = 0.0  # time.monotonic() when it last opened
        self.trial_in_flight = False
        # shared breaker only: each tenant's own breaker, when each last saw a failure status, and when each
        # last had an answer that was no failure
        self.tenants: dict[str, Breaker] = {}
        self._failing_since: dict[str, float] = {}
        self._served_at: dict[str, float] = {}

    def _become(self, state: State) -> None:
        old, self.state = self.state, state
        if state == "open":
            self.opened_at = time.monotonic()
        if state == "closed":
            self.failures = 0
        self.metrics.breaker_transitions.add(self.name, state)
        log.warning("circuit breaker changed state", extra={"breaker": self.name, "from": old, "to": state})

    def trial_done(self, _: object = None) -> None:
        self.trial_in_flight = False

    def seconds_to_trial(self) -> float:
        return self.seconds_left_open() if self.state == "open" else 0.0

    def seconds_left_open(self) -> float:
        """Seconds until an open breaker lets a trial through; asked on every call it refuses."""
        return max(0.0, self.reset_timeout - (time.monotonic() - self.opened_at))

    def configure(self, fail_max: int, reset_timeout: float, window_sec: float) -> None:
        for breaker in (self, *self.tenants.values()):
            breaker.fail_max = fail_max
            breaker.reset_timeout = reset_timeout
            breaker.window_sec = window_sec

    def of_tenant(self, tenant: str | None) -> Breaker:
        key = tenant or ANONYMOUS
        own = self.tenants.get(key)
        if own is None:
            own = self.tenants[key] = Breaker(f"{self.name}/{key}", self.fail_max, self.reset_timeout,
                                              self.metrics, self.window_sec, tenant=key)
        return own

    def failing_tenants(self, tenant: str) -> int:
        """Note that `tenant` just saw a failure status; how many tenants did within the window."""
        now = time.monotonic()
        self._failing_since[tenant] = now
        for name, seen in list(self._failing_since.items()):
            if now - seen > self.window_sec:
                del self._failing_since[name]
        return len(self._failing_since)

    def served(self, tenant: str) -> None:
        """Note that `tenant` just had an answer that was no failure."""
        self._served_at[tenant] = time.monotonic()

    def served_another(self, tenant: str) -> bool:
        """Whether a tenant other than `tenant` had an answer that was no failure within the window."""
        now = time.monotonic()
        for name, seen in list(self._served_at.items()):
            if now - seen > self.window_sec:
                del self._served_at[name]
        return any(name != tenant for name in self._served_at)

    def admit(self) -> bool:
        """Refuse the call while open (or while another call is the trial); True when this call is the trial."""
        state = self.state
        if state == "closed":
            return False
        if state == "open" and (wait := self.seconds_left_open()) > 0:
            raise self.refusal(wait)
        if self.trial_in_flight:
            raise self.refusal(1.0)
        self.trial_in_flight = True
        if state == "open":
            self._become("half-open")
        return True

    def refusal(self, retry_after: float) -> Exception:
        if self.tenant is None:
            return UpstreamError("circuit_open", "the circuit breaker is open", retry_after=retry_after)
        # the tenant's own: not an upstream failure, so no outbox or stale answer stands in for it
        return unavailable("your requests keep failing upstream, so they are refused for a while; check their "
                           "parameters", max(1, round(retry_after)), data={"reason": "tenant_circuit_open"})

    def record(self, failed: bool) -> None:
        """An answer's verdict. Closed: a failure adds to the run (`fail_max` in a row open it), a success ends
        the run. Half-open: the trial's answer closes or reopens it. Open: a late answer of a call made before it
        opened says nothing new, and is not counted."""
        if self.state == "closed":
            if not failed:
                self.failures = 0
                return
            self.failures += 1
            if self.failures >= self.fail_max:
                self._become("open")
        elif self.state == "half-open":
            self._become("open" if failed else "closed")

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "state": self.state, "failures": self.failures, "fail_max": self.fail_max,
            "reset_timeout_sec": self.reset_timeout, "seconds_to_trial": round(self.seconds_to_trial(), 3)}
        if self.tenant is None:
            out["tenants"] = {name: b.describe() for name, b in self.tenants.items()
                              if b.state != "closed" or b.failures}
        return out


class Breakers:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.by_upstream: dict[str, Breaker] = {}

    def get(self, upstream: str, fail_max: int, reset_timeout: float, window_sec: float = 10.0) -> Breaker:
        breaker = self.by_upstream.get(upstream)
        if breaker is None:
            breaker = self.by_upstream[upstream] = Breaker(upstream, fail_max, reset_timeout, self.metrics,
                                                           window_sec)
        else:
            breaker.configure(fail_max, reset_timeout, window_sec)
        return breaker


def guarded(breaker: Breaker, call: Callable[[], Awaitable[GatewayResponse]],
            failure_statuses: frozenset[int], tenant: str | None = None,
            direct: bool = False) -> Coroutine[Any, Any, GatewayResponse]:
    """`call` made through the upstream's breaker and the tenant's, to await: either open answers at once.
    `direct`: no tenant's breaker; a failure status counts toward `breaker` itself, as a transport failure does
    (a route with no tenant on a breaker of its own: gateway/policy/circuit_breaker.py)."""
    own = None if direct else breaker.of_tenant(tenant)
    if breaker.state == "closed" and (own is None or own.state == "closed"):
        return _through(breaker, own, call, failure_statuses)  # neither refuses nor wants a trial
    return _admitted(breaker, call, failure_statuses, own)


async def _admitted(breaker: Breaker, call: Callable[[], Awaitable[GatewayResponse]],
                    failure_statuses: frozenset[int], own: Breaker | None) -> GatewayResponse:
    """The call when a breaker is not closed: refused while open, else perhaps its trial."""
    shared_trial = breaker.admit()
    try:
        own_trial = own.admit() if own is not None else False
    except BaseException:
        if shared_trial:
            breaker.trial_done()
        raise
    if not (shared_trial or own_trial):
        return await _through(breaker, own, call, failure_statuses)
    # This call is a trial. It runs to its end even if its request is cancelled, so that the
    # upstream's answer decides whether the breaker closes.
    trial = asyncio.ensure_future(_through(breaker, own, call, failure_statuses))
    # the event loop holds tasks weakly: one whose request went away is held here until it ends
    _TRIALS.add(trial)
    trial.add_done_callback(_TRIALS.discard)
    if shared_trial:
        trial.add_done_callback(breaker.trial_done)
    if own is not None and own_trial:
        trial.add_done_callback(own.trial_done)
    try:
        return await asyncio.shield(trial)
    except asyncio.CancelledError:
        trial.add_done_callback(_release_unclaimed)
        raise


async def _through(shared: Breaker, own: Breaker | None, call: Callable[[], Awaitable[GatewayResponse]],
                   failure_statuses: frozenset[int]) -> GatewayResponse:
    try:
        resp = await call()
    # a request that went away (CancelledError, not an Exception) passes uncounted: it says nothing of the upstream
    except UpstreamError as exc:
        if exc.kind not in ("circuit_open",):
            shared.record(failed=True)
        raise
    except Exception:
        shared.record(failed=True)
        raise
    if own is None:
        shared.record(failed=resp.status in failure_statuses)
        return resp
    tenant = own.tenant or ANONYMOUS
    if resp.status in failure_statuses:
        if tenant_at_fault(shared, tenant, resp.status):
            own.record(failed=True)
        if shared.failing_tenants(tenant) >= 2:
            shared.record(failed=True)
    else:
        own.record(failed=False)
        shared.record(failed=False)
        shared.served(tenant)
    return resp


def tenant_at_fault(shared: Breaker, tenant: str, status: int) -> bool:
    """Whether a failure status is the calling tenant's own: any but an unavailable status is; an unavailable
    one only while the upstream is seen serving another tenant (else it answers so to everyone)."""
    return status not in UNAVAILABLE or shared.served_another(tenant)


def _release_unclaimed(trial: asyncio.Future[GatewayResponse]) -> None:
    """A trial whose request went away: its answer goes unread, so its connection is given back."""
    if not trial.cancelled() and trial.exception() is None:
        trial.result().close()
