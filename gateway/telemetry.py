"""The gateway's metrics (Prometheus text through prometheus_client) and traces (OpenTelemetry, W3C propagation).

Metrics are counted in process by plain tallies and histograms and handed to
prometheus_client by one collector at scrape time: a `Counter.labels().inc()`
costs a lock and a dict lookup per call, a tally well under a microsecond on the
cache-hit path. The gateway's own metrics are declared in `Metrics`; a plugin declares its own
through `Metrics.tally` under its own name. Each known label combination gets a
zero before its first event (`seed`, and each plugin when its route is built),
so a rate() or an alert has a series from the first scrape.

OpenTelemetry is for traces only; `gateway.tracing` sets it up.
"""
from __future__ import annotations

import bisect
import itertools
import logging
from collections import Counter
from typing import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from exports_common.otel import TracingConfig
from gateway import worker_metrics
from gateway.tracing import ServerTrace, Tracing, inject, setup_tracing

_failed_gauges: set[str] = set()


def gauge_failed(name: str, exc: Exception) -> None:
    """A gauge whose read raised: logged the first time (a scrape comes every few seconds), then left out."""
    if name not in _failed_gauges:
        _failed_gauges.add(name)
        logging.getLogger("gateway.metrics").error(
            f"gauge {name} could not be read; it is left out of /metrics (logged once)",
            extra={"gauge": name, "error": f"{type(exc).__name__}: {exc}"[:500]}, exc_info=exc)

__all__ = ["Metrics", "ServerTrace", "Tracing", "inject", "prometheus_text", "setup"]

BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BOUND_LABELS = [str(b) for b in BOUNDS] + ["+Inf"]


class Tally:
    """A monotonic counter keyed by label values."""

    def __init__(self, name: str, labels: tuple[str, ...], description: str) -> None:
        self.name = name
        self.labels = labels
        self.description = description
        self.counts: Counter[tuple[str, ...]] = Counter()

    def add(self, *values: str, amount: int = 1) -> None:
        self.counts[values] += amount

    def seed(self, *values: str) -> None:
        self.counts[values] += 0

    def total(self, **match: str) -> int:
        idx = {label: i for i, label in enumerate(self.labels)}
        return sum(n for key, n in self.counts.items() if all(key[idx[k]] == v for k, v in match.items()))

    def families(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.description, labels=self.labels)
        for key, count in list(self.counts.items()):
            family.add_metric(list(key), count)
        yield family


class _Series:
    """One histogram series: a count per bucket (the last is +Inf) and the sum of what was observed."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.total += seconds


class LatencyHistogram:
    """Seconds in Prometheus histogram buckets: a bisect and an increment per observation."""

    def __init__(self, name: str, labels: tuple[str, ...], description: str) -> None:
        self.name = name
        self.labels = labels
        self.description = description
        self.series: dict[tuple[str, ...], _Series] = {}

    def record(self, seconds: float, *values: str) -> None:
        series = self.series.get(values)
        if series is None:
            series = self.series[values] = _Series()
        series.observe(seconds)

    def families(self) -> Iterator[Metric]:
        yield _histogram(self.name, self.description, self.labels,
                         ((list(k), list(s.counts), s.total) for k, s in list(self.series.items())))


def _histogram(name: str, description: str, labels: Iterable[str],
               series: Iterable[tuple[list[str], list[int], float]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, description, labels=list(labels))
    for values, counts, total in series:
        family.add_metric(values, list(zip(_BOUND_LABELS, itertools.accumulate(counts), strict=True)), total)
    return family


class RequestStats:
    """Every answered request, recorded once and exported three ways.

    One histogram keyed by (route, method, route path, status) gives the request
    count by route and status, the latency by route (the gateway's own names), and
    OpenTelemetry's `http.server.request.duration` by method, route and status.
    The status stays a number until exported: every request records one.
    """

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str, int], _Series] = {}

    def record(self, seconds: float, route: str, method: str, path: str, status: int) -> None:
        series = self.series.get((route, method, path, status))
        if series is None:
            series = self.series[(route, method, path, status)] = _Series()
        series.observe(seconds)

    def total(self, **match: str) -> int:
        idx = {"route": 0, "method": 1, "path": 2, "status": 3}
        return sum(sum(s.counts) for k, s in self.series.items()
                   if all(str(k[idx[n]]) == v for n, v in match.items()))

    def families(self) -> Iterator[Metric]:
        snapshot = [((route, method, path, str(status)), list(s.counts), s.total)
                    for (route, method, path, status), s in list(self.series.items())]
        requests = CounterMetricFamily("gateway_requests", "client requests by route and status",
                                       labels=("route", "status"))
        by_route: dict[str, tuple[list[int], float]] = {}
        for (route, _, _, status), counts, total in snapshot:
            requests.add_metric([route, status], sum(counts))
            merged, seconds = by_route.get(route, ([0] * len(counts), 0.0))
            by_route[route] = ([a + b for a, b in zip(merged, counts, strict=True)], seconds + total)
        yield requests
        yield _histogram("gateway_request_duration_seconds", "time to answer, by route", ("route",),
                         (([route], c, s) for route, (c, s) in by_route.items()))
        yield _histogram("http_server_request_duration_seconds",
                         "OpenTelemetry http.server.request.duration: time to answer, by method, route and status",
                         ("http_request_method", "http_route", "http_response_status_code"),
                         (([m, p, st], c, s) for (_, m, p, st), c, s in snapshot))


Gauge = Callable[[], Iterable[tuple[float, dict[str, str]]]]


class Metrics(Collector):
    def __init__(self) -> None:
        self.requests = RequestStats()
        self.upstream_calls = Tally("gateway_upstream_calls", ("upstream", "route", "outcome"),
                                    "calls made to upstreams, by outcome: a status, or connect_error, timeout, reset")
        self.upstream_duration = LatencyHistogram("gateway_upstream_duration_seconds", ("upstream", "route"),
                                                  "time to an upstream's answer (headers), by upstream and route")
        # shared by every plugin that answers in the upstream's stead: each seeds and counts its own kinds
        self.degraded = Tally("gateway_degraded_answers", ("route", "kind"),
                              "answers from degradation: stale, unavailable, outbox, outbox_pending, reject")
        self.ejections = Tally("gateway_upstream_ejections", ("upstream", "endpoint"),
                               "endpoints left out for a while after repeated connect failures")
        self.breaker_transitions = Tally("gateway_breaker_transitions", ("upstream", "state"),
                                         "circuit breaker state changes, by new state")
        self.config_reloads = Tally("gateway_config_reloads", ("outcome",), "config reloads: applied, refused "
                                    "(invalid or unsafe) or refused_removals (it removed routes or plugins)")
        self.admin_auth_failures = Tally("gateway_admin_auth_failures", ("outcome",), "failed admin "
                                         "authentications: refused (401) or limited (429, too many from an address)")
        self.operator_actions = Tally("gateway_operator_actions", ("action", "outcome"),
                                      "operator recovery actions through the admin API")
        self._owned: dict[str, Tally] = {}  # the plugins' own counters, by metric name
        self._gauges: list[tuple[str, str, Gauge]] = []
        # values read by awaiting something (the outbox size in Redis): refreshed before each scrape
        self.async_values: dict[str, float] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def _tallies(self) -> list[Tally]:
        return [v for v in vars(self).values() if isinstance(v, Tally)] + list(self._owned.values())

    def tally(self, name: str, labels: tuple[str, ...], description: str) -> Tally:
        """A plugin's own counter, made on first use and the same object after (across config reloads)."""
        owned = self._owned.get(name)
        if owned is None:
            owned = self._owned[name] = Tally(name, labels, description)
        elif owned.labels != labels:
            raise ValueError(f"metric {name} is already counted with labels {owned.labels}")
        return owned

    def observe_gauge(self, name: str, description: str, read: Gauge) -> None:
        self._gauges.append((name, description, read))

    def seed(self, routes: Iterable[tuple[str, str]]) -> None:
        """Zero for each (route, upstream)'s outcomes an alert or a dashboard reads (plugins seed their own)."""
        for route, upstream in routes:
            for outcome in ("connect_error", "timeout", "reset"):
                self.upstream_calls.seed(upstream, route, outcome)
            for state in ("open", "half-open", "closed"):
                self.breaker_transitions.seed(upstream, state)
        for outcome in ("applied", "refused", "refused_removals"):
            self.config_reloads.seed(outcome)
        for outcome in ("refused", "limited"):
            self.admin_auth_failures.seed(outcome)

    def collect(self) -> Iterator[Metric]:
        yield from self.requests.families()
        yield from self.upstream_duration.families()
        for tally in self._tallies():
            yield from tally.families()
        for name, description, read in self._gauges:
            try:
                values = list(read())
            except Exception as exc:  # noqa: BLE001 - a plugin's gauge that fails is left out, not the scrape
                gauge_failed(name, exc)
                continue
            labels = sorted({k for _, attrs in values for k in attrs})
            family = GaugeMetricFamily(name, description, labels=labels)
            for value, attrs in values:
                family.add_metric([attrs.get(k, "") for k in labels], value)
            yield family


def setup(service_name: str, tracing: TracingConfig) -> tuple[Metrics, Tracing]:
    """The process's metrics and its tracer (OpenTelemetry's provider is installed once per process)."""
    return Metrics(), setup_tracing(service_name, tracing)


def prometheus_text(metrics: Metrics) -> tuple[bytes, str]:
    """This process's metrics; with `run --workers N`, every worker's (gateway.worker_metrics)."""
    where = worker_metrics.directory()
    registry = metrics.registry if where is None else worker_metrics.merged_registry(metrics.registry, where)
    return generate_latest(registry), CONTENT_TYPE_LATEST
