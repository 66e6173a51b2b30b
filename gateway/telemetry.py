"""The gateway's metrics (prometheus_client) and traces (OpenTelemetry, W3C propagation).

Every metric is a prometheus_client object in the process's own registry; a
labelled metric's children are kept by their label values, so counting an event
is one dict lookup and prometheus_client's increment. The gateway's own metrics
are declared in `Metrics`; a plugin declares its own through `Metrics.tally`
under its own name. Each known label combination gets a zero before its first
event (`seed`, and each plugin when its route is built), so a rate() or an alert
has a series from the first scrape. The request families are the exception:
each answered request is one observation of an internal histogram, served at
scrape time as the three families its labels sum to (`RequestFamilies`).

With `run --workers N` the workers count in prometheus_client's multiprocess
mode (files in $PROMETHEUS_MULTIPROC_DIR, prepared by exports_common.workers):
whichever worker is scraped answers for all of them; a dead worker's counts stay
in the totals, its gauges leave with it.

OpenTelemetry is for traces only; `gateway.tracing` sets it up.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Generic, Iterable, Literal, TypeVar

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from exports_common import periodic
from exports_common.otel import TracingConfig
from exports_common.workers import METRICS_DIR_ENV, forget_gone
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

log = logging.getLogger("gateway")
BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GAUGE_REFRESH_SEC = 1.0  # with several workers: how old another worker's gauges may be when one is scraped
# the series the dashboards and alerts read, without a `_created` sample beside each counter and histogram
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client


def multiprocess_dir() -> str | None:
    """The directory the workers of `run --workers N` count in; None for a process that answers for itself."""
    return os.environ.get(METRICS_DIR_ENV) or None


Labelled = TypeVar("Labelled", prometheus_client.Counter, prometheus_client.Histogram)


class _Children(Generic[Labelled]):
    """A labelled prometheus_client metric, its children kept by label values (`labels()` once for each)."""

    def __init__(self, metric: Labelled) -> None:
        self.metric: Labelled = metric
        self.children: dict[tuple[str, ...], Labelled] = {}

    def child(self, values: tuple[str, ...]) -> Labelled:
        found = self.children.get(values)
        if found is None:
            found = self.children[values] = self.metric.labels(*values)
        return found


class Tally(_Children[prometheus_client.Counter]):
    """A monotonic counter keyed by label values (a prometheus_client Counter)."""

    def __init__(self, name: str, labels: tuple[str, ...], description: str, registry: CollectorRegistry) -> None:
        super().__init__(prometheus_client.Counter(name, description, labels, registry=registry))
        self.name = name
        self.labels = labels

    def add(self, *values: str, amount: int = 1) -> None:
        self.child(values).inc(amount)

    def seed(self, *values: str) -> None:
        self.child(values)

    def total(self, **match: str) -> int:
        """This process's count over every series whose labels match."""
        return int(sum(sample.value for family in self.metric.collect() for sample in family.samples
                       if sample.name.endswith("_total")
                       and all(sample.labels.get(k) == v for k, v in match.items())))


class LatencyHistogram(_Children[prometheus_client.Histogram]):
    """Seconds in Prometheus histogram buckets, keyed by label values (a prometheus_client Histogram)."""

    def __init__(self, name: str, labels: tuple[str, ...], description: str, registry: CollectorRegistry) -> None:
        super().__init__(prometheus_client.Histogram(name, description, labels, registry=registry, buckets=BOUNDS))

    def record(self, seconds: float, *values: str) -> None:
        self.child(values).observe(seconds)


ANSWERED = "gateway_answered_requests"  # the internal histogram; never served under this name
_ANSWERED_LABELS = ("route", "status", "http_request_method", "http_route")


class RequestStats:
    """Every answered request, in one observation of an internal histogram keyed by route, status, method and
    route path: one prometheus_client call (two locked increments) per request instead of one for each family.

    The families served are summed from its samples at scrape time (`RequestFamilies`): the request count by
    route and status, the latency by route (the gateway's own names), and OpenTelemetry's
    `http.server.request.duration` by method, route and status.
    """

    def __init__(self) -> None:
        # in no registry: `RequestFamilies` serves it under the three names the dashboards and alerts read
        self.histogram = prometheus_client.Histogram(ANSWERED, "answered requests", _ANSWERED_LABELS, registry=None,
                                                     buckets=BOUNDS)
        self.children: dict[tuple[str, str, str, int], prometheus_client.Histogram] = {}

    def record(self, seconds: float, route: str, method: str, path: str, status: int) -> None:
        child = self.children.get((route, method, path, status))
        if child is None:
            child = self.children[(route, method, path, status)] = self.histogram.labels(
                route, str(status), method, path)
        child.observe(seconds)


class _Sums:
    """One served histogram series: its cumulative bucket counts by bound (`le`), its count and its sum."""

    def __init__(self) -> None:
        self.buckets: dict[str, float] = {}
        self.count = 0.0
        self.sum = 0.0

    def add(self, sample: Sample) -> None:
        if sample.name.endswith("_bucket"):
            bound = sample.labels["le"]
            self.buckets[bound] = self.buckets.get(bound, 0.0) + sample.value
        elif sample.name.endswith("_count"):
            self.count += sample.value
        elif sample.name.endswith("_sum"):
            self.sum += sample.value

    def bucket_list(self) -> list[tuple[str, float]]:
        return sorted(self.buckets.items(), key=lambda bucket: float(bucket[0]))


def _sums_by(samples: Iterable[Sample], labels: tuple[str, ...]) -> dict[tuple[str, ...], _Sums]:
    """The internal histogram's samples summed over every label but `labels`."""
    grouped: dict[tuple[str, ...], _Sums] = {}
    for sample in samples:
        key = tuple(sample.labels[name] for name in labels)
        sums = grouped.get(key)
        if sums is None:
            sums = grouped[key] = _Sums()
        sums.add(sample)
    return grouped


def request_families(samples: list[Sample]) -> list[Metric]:
    """The three request families the gateway serves, from the internal histogram's samples."""
    count = CounterMetricFamily("gateway_requests", "client requests by route and status",
                                labels=("route", "status"))
    for key, sums in _sums_by(samples, ("route", "status")).items():
        count.add_metric(key, sums.count)
    by_route = HistogramMetricFamily("gateway_request_duration_seconds", "time to answer, by route",
                                     labels=("route",))
    for key, sums in _sums_by(samples, ("route",)).items():
        by_route.add_metric(key, sums.bucket_list(), sums.sum)
    by_method = HistogramMetricFamily(
        "http_server_request_duration_seconds",
        "OpenTelemetry http.server.request.duration: time to answer, by method, route and status",
        labels=("http_request_method", "http_route", "http_response_status_code"))
    for key, sums in _sums_by(samples, ("http_request_method", "http_route", "status")).items():
        by_method.add_metric(key, sums.bucket_list(), sums.sum)
    return [count, by_route, by_method]


class RequestFamilies(Collector):
    """A registry's view of `source` (this process's internal histogram, or every worker's metrics merged by
    prometheus_client's MultiProcessCollector) with the internal histogram served as the three request families;
    every other family passes as it is. The families are served, empty, before the first request."""

    def __init__(self, source: Collector) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return request_families([])

    def collect(self) -> Iterable[Metric]:
        answered: list[Sample] = []
        for family in self.source.collect():
            if family.name == ANSWERED:
                answered = family.samples
            else:
                yield family
        yield from request_families(answered)


Gauge = Callable[[], Iterable[tuple[float, dict[str, str]]]]
# how the workers' values of one gauge make its figure: the worst (max), their sum (a per-worker quantity), or
# the latest read (a value of shared state, which every worker reads alike)
GaugeMerge = Literal["max", "sum", "latest"]
_MODES: dict[GaugeMerge, Literal["livemax", "livesum", "livemostrecent"]] = {
    "max": "livemax", "sum": "livesum", "latest": "livemostrecent"}


class _ObservedGauge:
    """A gauge whose values a callable reads, set into a prometheus_client Gauge at each refresh."""

    def __init__(self, name: str, description: str, read: Gauge, merge: GaugeMerge,
                 labels: Iterable[str] | None) -> None:
        self.name, self.description, self.read, self.merge = name, description, read, merge
        self.declared = None if labels is None else sorted(labels)
        self.labels: list[str] = []
        # made at the first refresh when its label names are declared (then served while it has no series yet),
        # else at the first read with values
        self.gauge: prometheus_client.Gauge | None = None
        self.shown: set[tuple[str, ...]] = set()

    def refresh(self, registry: CollectorRegistry) -> None:
        try:
            values = list(self.read())
        except Exception as exc:  # noqa: BLE001 - a plugin's gauge that fails is left out, not the scrape
            gauge_failed(self.name, exc)
            return
        if self.gauge is None:
            if not values and self.declared is None:
                return
            self.labels = self.declared if self.declared is not None else sorted(
                {k for _, attrs in values for k in attrs})
            self.gauge = prometheus_client.Gauge(self.name, self.description, self.labels, registry=registry,
                                                 multiprocess_mode=_MODES[self.merge])
        seen = set()
        for value, attrs in values:
            key = tuple(attrs.get(k, "") for k in self.labels)
            seen.add(key)
            (self.gauge.labels(*key) if self.labels else self.gauge).set(value)
        for gone in self.shown - seen:  # a series no longer read (a route removed by a reload)
            self.gauge.remove(*gone)
        self.shown = seen


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestStats()
        self.registry.register(RequestFamilies(self.requests.histogram))
        self.upstream_calls = self._tally(
            "gateway_upstream_calls", ("upstream", "route", "outcome"),
            "calls made to upstreams, by outcome: a status, or connect_error, timeout, reset")
        self.upstream_duration = LatencyHistogram(
            "gateway_upstream_duration_seconds", ("upstream", "route"),
            "time to an upstream's answer (headers), by upstream and route", self.registry)
        # shared by every plugin that answers in the upstream's stead: each seeds and counts its own kinds
        self.degraded = self._tally("gateway_degraded_answers", ("route", "kind"),
                                    "answers from degradation: stale, unavailable, outbox, outbox_pending, reject")
        self.ejections = self._tally("gateway_upstream_ejections", ("upstream", "endpoint"),
                                     "endpoints left out for a while after repeated connect failures")
        self.breaker_transitions = self._tally("gateway_breaker_transitions", ("upstream", "state"),
                                               "circuit breaker state changes, by new state")
        self.config_reloads = self._tally("gateway_config_reloads", ("outcome",), "config reloads: applied, refused "
                                          "(invalid or unsafe) or refused_removals (it removed routes or plugins)")
        self.admin_auth_failures = self._tally("gateway_admin_auth_failures", ("outcome",), "failed admin "
                                               "authentications: refused (401) or limited (429, too many from an "
                                               "address)")
        self.operator_actions = self._tally("gateway_operator_actions", ("action", "outcome"),
                                            "operator recovery actions through the admin API")
        self._owned: dict[str, Tally] = {}  # the plugins' own counters, by metric name
        self._gauges: dict[str, _ObservedGauge] = {}
        # values read by awaiting something (the outbox size in Redis): refreshed before each scrape
        self.async_values: dict[str, float] = {}

    def _tally(self, name: str, labels: tuple[str, ...], description: str) -> Tally:
        return Tally(name, labels, description, self.registry)

    def tally(self, name: str, labels: tuple[str, ...], description: str) -> Tally:
        """A plugin's own counter, made on first use and the same object after (across config reloads)."""
        owned = self._owned.get(name)
        if owned is None:
            owned = self._owned[name] = self._tally(name, labels, description)
        elif owned.labels != labels:
            raise ValueError(f"metric {name} is already counted with labels {owned.labels}")
        return owned

    def observe_gauge(self, name: str, description: str, read: Gauge, merge: GaugeMerge = "max",
                      labels: Iterable[str] | None = None) -> None:
        """A gauge read from `read` before each scrape (and, with several workers, once a second); declared again
        (a reload), its reader is replaced. With `labels` it is served from the start, before any series."""
        known = self._gauges.get(name)
        if known is None:
            self._gauges[name] = _ObservedGauge(name, description, read, merge, labels)
        else:
            known.read = read

    def refresh_gauges(self) -> None:
        for gauge in self._gauges.values():
            gauge.refresh(self.registry)

    async def refresh_gauges_forever(self) -> None:
        """With several workers: this worker's gauges into the shared files, for whichever worker is scraped."""
        async def step() -> None:
            self.refresh_gauges()

        await periodic.periodic("worker gauges", step, GAUGE_REFRESH_SEC, log,
                                expected={OSError: f"check that {multiprocess_dir()} is writable and its disk "
                                                   f"not full"})

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


def setup(service_name: str, tracing: TracingConfig) -> tuple[Metrics, Tracing]:
    """The process's metrics and its tracer (OpenTelemetry's provider is installed once per process)."""
    return Metrics(), setup_tracing(service_name, tracing)


def prometheus_text(metrics: Metrics) -> tuple[bytes, str]:
    """This process's metrics; with `run --workers N`, every worker's (prometheus_client's multiprocess mode)."""
    metrics.refresh_gauges()
    where = multiprocess_dir()
    if where is None:
        return generate_latest(metrics.registry), CONTENT_TYPE_LATEST
    forget_gone(where)
    registry = CollectorRegistry()
    merged = MultiProcessCollector(None, where)  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    registry.register(RequestFamilies(merged))
    return generate_latest(registry), CONTENT_TYPE_LATEST
