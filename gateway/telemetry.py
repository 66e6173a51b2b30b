"""OpenTelemetry for the gateway: metrics exported in Prometheus text, spans with W3C propagation.

Counters on the request path are plain in-process tallies that OpenTelemetry
reads at scrape time (observable counters): an SDK `Counter.add` costs ~17 us
with attributes, a dict increment well under one. Latency histograms are counted
the same way and handed to prometheus_client directly (`LatencyHistogram`).
Instruments are all created here, so the metric names an SRE sees are listed in
one place.
"""
from __future__ import annotations

import bisect
import contextlib
import itertools
import random
from collections import Counter, defaultdict
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

_installed = False


class Tally:
    """A monotonic counter keyed by label values, observed by OpenTelemetry at collection time."""

    def __init__(self, meter: metrics.Meter, name: str, labels: tuple[str, ...], description: str) -> None:
        self.labels = labels
        self.counts: Counter[tuple[str, ...]] = Counter()
        meter.create_observable_counter(name, callbacks=[self._observe], description=description)

    def add(self, *values: str, amount: int = 1) -> None:
        self.counts[values] += amount

    def total(self, **match: str) -> int:
        idx = {label: i for i, label in enumerate(self.labels)}
        return sum(n for key, n in self.counts.items() if all(key[idx[k]] == v for k, v in match.items()))

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        for key, count in list(self.counts.items()):
            yield Observation(count, dict(zip(self.labels, key, strict=False)))


class LatencyHistogram:
    """Latency in Prometheus histogram buckets, counted in process and exported at scrape time.

    An SDK histogram `record` costs 10-17 us (a tenth of a cache hit), and its
    default buckets are for milliseconds. Buckets are counted here (a bisect and an
    increment) and handed to prometheus_client as a real histogram
    (`<name>_bucket{le=...}`, `<name>_sum`, `<name>_count`), which is what
    `histogram_quantile()` needs: OpenTelemetry's exporter would rename observable
    counters standing in for them (`<name>_bucket_seconds_total`).
    """

    BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

    def __init__(self, name: str, labels: tuple[str, ...], description: str) -> None:
        self.name = name
        self.labels = labels
        self.description = description
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: defaultdict[tuple[str, ...], float] = defaultdict(float)
        _HISTOGRAMS[name] = self  # the newest with a name is the one exported

    def record(self, seconds: float, *values: str) -> None:
        counts = self.counts.get(values)
        if counts is None:
            counts = self.counts[values] = [0] * (len(self.BOUNDS) + 1)
        counts[bisect.bisect_left(self.BOUNDS, seconds)] += 1
        self.sums[values] += seconds

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.description, labels=self.labels)
        bounds = [str(b) for b in self.BOUNDS] + ["+Inf"]
        for values, counts in list(self.counts.items()):
            cumulative = zip(bounds, itertools.accumulate(counts), strict=True)
            family.add_metric(list(values), list(cumulative), self.sums[values])
        return family


_HISTOGRAMS: dict[str, LatencyHistogram] = {}


class _HistogramCollector(Collector):
    def collect(self) -> Iterator[HistogramMetricFamily]:
        for histogram in list(_HISTOGRAMS.values()):
            yield histogram.family()


class Metrics:
    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self.requests = Tally(meter, "gateway_requests", ("route", "status"), "client requests by route and status")
        self.duration = LatencyHistogram("gateway_request_duration_seconds", ("route",), "time to answer, by route")
        self.upstream_calls = Tally(meter, "gateway_upstream_calls", ("upstream", "route", "outcome"),
                                    "calls made to upstreams, by outcome (status or error)")
        self.upstream_duration = LatencyHistogram("gateway_upstream_duration_seconds", ("upstream", "route"),
                                                  "time to an upstream's answer (headers), by upstream and route")
        self.cache = Tally(meter, "gateway_status_cache", ("route", "result"), "status cache lookups by result")
        self.idempotency = Tally(meter, "gateway_idempotency", ("route", "result"), "idempotency-key outcomes")
        self.retries = Tally(meter, "gateway_retries", ("upstream", "route", "reason"), "retry tries, by cause")
        self.retry_budget_exhausted = Tally(meter, "gateway_retry_budget_exhausted", ("upstream", "route"),
                                            "retries not made because the budget was used up")
        self.ejections = Tally(meter, "gateway_upstream_ejections", ("upstream", "endpoint"),
                               "endpoints left out for a while after repeated connect failures")
        self.breaker_transitions = Tally(meter, "gateway_breaker_transitions", ("upstream", "state"),
                                         "circuit breaker state changes, by new state")
        self.degraded = Tally(meter, "gateway_degraded_answers", ("route", "kind"),
                              "answers from degradation: stale status, outbox, reject, unavailable")
        self.outbox = Tally(meter, "gateway_outbox", ("outcome",), "outboxed submissions delivered or refused")
        self.reruns = Tally(meter, "gateway_reruns", ("route", "outcome"), "TIMEOUT/FAILED re-runs asked for")


    def observe_gauge(self, name: str, description: str,
                      read: Callable[[], Iterable[tuple[float, dict[str, str]]]]) -> None:
        self.meter.create_observable_gauge(name, description=description, callbacks=[
            lambda options: [Observation(value, attrs) for value, attrs in read()]])


@dataclass(frozen=True)
class ServerTrace:
    trace_id: str  # 32 hex digits, for the logs
    span: trace.Span  # INVALID_SPAN when nothing records: setting attributes on it does nothing


# a request with no exporter and no traceparent: its fresh (trace id, span id), made into a
# traceparent only when a call leaves the gateway
_fresh_ids: ContextVar[tuple[int, int] | None] = ContextVar("fresh_trace_ids", default=None)


def inject(carrier: dict[str, str]) -> None:
    """W3C trace headers for a call out of the gateway, whichever way the request is traced."""
    propagate.inject(carrier)
    if "traceparent" not in carrier and (ids := _fresh_ids.get()) is not None:
        carrier["traceparent"] = f"00-{ids[0]:032x}-{ids[1]:016x}-00"


class Tracing:
    """Spans when there is somewhere to send them; W3C trace ids propagate either way.

    With no exporter, even unsampled SDK spans, or just an OpenTelemetry context
    attached per request, cost microseconds a request for nothing: then the
    client's `traceparent` is carried as it came, and a request without one gets
    a fresh trace id that becomes a `traceparent` only if a call goes upstream
    (`inject`). A cache hit never builds one.
    """

    def __init__(self, tracer: trace.Tracer, recording: bool) -> None:
        self.tracer = tracer
        self.recording = recording

    @staticmethod
    def _client_context(headers: Mapping[str, str]) -> context.Context | None:
        if "traceparent" not in headers:
            return None
        parent = propagate.extract(headers)
        return parent if trace.get_current_span(parent).get_span_context().is_valid else None

    @contextlib.contextmanager
    def server(self, name: str, headers: Mapping[str, str], attributes: dict[str, Any]) -> Iterator[ServerTrace]:
        parent = self._client_context(headers)
        if self.recording:
            with self.tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER,
                                                   attributes=attributes) as span:
                yield ServerTrace(trace.format_trace_id(span.get_span_context().trace_id), span)
            return
        if parent is not None:
            token = context.attach(parent)
            try:
                trace_id = trace.get_current_span(parent).get_span_context().trace_id
                yield ServerTrace(trace.format_trace_id(trace_id), trace.INVALID_SPAN)
            finally:
                context.detach(token)
            return
        ids = (random.getrandbits(128) or 1, random.getrandbits(64) or 1)
        fresh = _fresh_ids.set(ids)
        try:
            yield ServerTrace(f"{ids[0]:032x}", trace.INVALID_SPAN)
        finally:
            _fresh_ids.reset(fresh)

    @contextlib.contextmanager
    def client(self, name: str, attributes: dict[str, Any]) -> Iterator[trace.Span]:
        if not self.recording:
            yield trace.get_current_span()
            return
        with self.tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
            yield span


def _sampler(exporter: str, ratio: float) -> Sampler:
    return ALWAYS_OFF if exporter == "none" else ParentBased(TraceIdRatioBased(ratio))


def setup(service_name: str, exporter: Literal["none", "console"], sample_ratio: float = 1.0,
          ) -> tuple[Metrics, Tracing]:
    """Install the providers once per process (OpenTelemetry allows setting them only once)."""
    global _installed  # noqa: PLW0603 - OpenTelemetry's providers are process-wide and set once
    if not _installed:
        resource = Resource.create({"service.name": service_name})
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()]))
        provider = TracerProvider(resource=resource, sampler=_sampler(exporter, sample_ratio))
        if exporter == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
        REGISTRY.register(_HistogramCollector())
        _installed = True
    return Metrics(metrics.get_meter("gateway")), Tracing(trace.get_tracer("gateway"), exporter != "none")


def prometheus_text() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
