"""One circuit breaker per upstream (pybreaker), shared by every route to that upstream.

pybreaker has no asyncio support of its own: the circuit_breaker plugin wraps the
awaited call in `calling()`. What pybreaker does not do is hold half-open to one
trial: with coroutines, many calls can enter while the first is still awaiting.
`trial_in_flight` closes that gap.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import pybreaker

from gateway.response import GatewayResponse
from gateway.telemetry import Metrics
from gateway.upstream import UpstreamError

log = logging.getLogger("gateway.breaker")
STATES = {"closed": 0, "half-open": 1, "open": 2}


class _Report(pybreaker.CircuitBreakerListener):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def state_change(self, cb: pybreaker.CircuitBreaker, old: object, new: object) -> None:
        old_name, new_name = getattr(old, "name", str(old)), getattr(new, "name", str(new))
        self.metrics.breaker_transitions.add(cb.name or "", new_name)
        log.warning("circuit breaker changed state", extra={"upstream": cb.name, "from": old_name, "to": new_name})


class Breaker:
    def __init__(self, upstream: str, fail_max: int, reset_timeout: float, metrics: Metrics) -> None:
        self.cb = pybreaker.CircuitBreaker(
            fail_max=fail_max, reset_timeout=reset_timeout, name=upstream, throw_new_error_on_trip=False,
            # a cancelled request says nothing about the upstream (a trial runs on in a task of its own)
            exclude=[lambda exc: isinstance(exc, asyncio.CancelledError)],
            listeners=[_Report(metrics)],
        )
        self.trial_in_flight = False
        self._opened: object = None
        self._opened_ts = 0.0

    def trial_done(self, _: asyncio.Future[GatewayResponse]) -> None:
        self.trial_in_flight = False

    @property
    def state(self) -> str:
        return self.cb.current_state

    def seconds_to_trial(self) -> float:
        return self.seconds_left_open() if self.state == "open" else 0.0

    def seconds_left_open(self) -> float:
        """Seconds until an open breaker lets a trial through; asked on every call it refuses."""
        opened = self.cb._state_storage.opened_at  # pybreaker keeps it there; no public accessor
        if opened is None:
            return 0.0
        if opened is not self._opened:  # convert each opening's datetime once, not per refusal
            self._opened, self._opened_ts = opened, opened.timestamp()
        return max(0.0, self.cb.reset_timeout - (time.time() - self._opened_ts))

    def configure(self, fail_max: int, reset_timeout: float) -> None:
        self.cb.fail_max = fail_max
        self.cb.reset_timeout = reset_timeout

    def describe(self) -> dict[str, object]:
        return {"state": self.state, "failures": self.cb.fail_counter, "fail_max": self.cb.fail_max,
                "reset_timeout_sec": self.cb.reset_timeout, "seconds_to_trial": round(self.seconds_to_trial(), 3)}


class Breakers:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.by_upstream: dict[str, Breaker] = {}

    def get(self, upstream: str, fail_max: int, reset_timeout: float) -> Breaker:
        breaker = self.by_upstream.get(upstream)
        if breaker is None:
            breaker = self.by_upstream[upstream] = Breaker(upstream, fail_max, reset_timeout, self.metrics)
        else:
            breaker.configure(fail_max, reset_timeout)
        return breaker


class _FailedStatus(Exception):
    def __init__(self, resp: GatewayResponse) -> None:
        super().__init__(f"upstream answered {resp.status}")
        self.resp = resp


async def guarded(breaker: Breaker, call: Callable[[], Awaitable[GatewayResponse]],
                  failure_statuses: frozenset[int]) -> GatewayResponse:
    """Make `call` through the breaker: an open breaker answers at once, 5xx answers count as failures."""
    state = breaker.state
    if state == "open" and (wait := breaker.seconds_left_open()) > 0:
        raise UpstreamError("circuit_open", "the circuit breaker is open", retry_after=wait)
    if state == "closed":
        return await _through(breaker, call, failure_statuses)
    if breaker.trial_in_flight:
        raise UpstreamError("circuit_open", "a trial request is testing the upstream", retry_after=1.0)
    # This call is the trial. It runs to its end even if its request is cancelled, so that the
    # upstream's answer decides whether the breaker closes: pybreaker would count the cancellation
    # (excluded) as a success and close it on no evidence.
    breaker.trial_in_flight = True
    trial = asyncio.ensure_future(_through(breaker, call, failure_statuses))
    trial.add_done_callback(breaker.trial_done)
    try:
        return await asyncio.shield(trial)
    except asyncio.CancelledError:
        trial.add_done_callback(_release_unclaimed)
        raise


async def _through(breaker: Breaker, call: Callable[[], Awaitable[GatewayResponse]],
                   failure_statuses: frozenset[int]) -> GatewayResponse:
    try:
        with breaker.cb.calling():
            resp = await call()
            if resp.status in failure_statuses:
                raise _FailedStatus(resp)
    except pybreaker.CircuitBreakerError as exc:
        raise UpstreamError("circuit_open", str(exc), retry_after=breaker.seconds_to_trial() or 1.0) from exc
    except _FailedStatus as failed:
        return failed.resp
    return resp


def _release_unclaimed(trial: asyncio.Future[GatewayResponse]) -> None:
    """A trial whose request went away: its answer goes unread, so its connection is given back."""
    if not trial.cancelled() and trial.exception() is None:
        trial.result().close()
