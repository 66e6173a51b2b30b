"""OpenTelemetry for the gateway: metrics exported in Prometheus text, spans with W3C propagation.

Instruments are created once here and used by name elsewhere, so the metric
names an SRE sees are all listed in one place.
"""
from __future__ import annotations

import logging
from typing import Literal

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger("gateway.telemetry")
_installed = False


class Metrics:
    def __init__(self, meter: metrics.Meter) -> None:
        self.requests = meter.create_counter("gateway_requests", description="client requests by route and status")
        self.duration = meter.create_histogram("gateway_request_duration", unit="s", description="time to answer")
        self.upstream_calls = meter.create_counter("gateway_upstream_calls", description="calls made to upstreams")
        self.upstream_duration = meter.create_histogram("gateway_upstream_duration", unit="s")
        self.cache = meter.create_counter("gateway_status_cache", description="status cache lookups by result")
        self.idempotency = meter.create_counter("gateway_idempotency", description="idempotency-key outcomes")


def setup(service_name: str, exporter: Literal["none", "console"]) -> tuple[Metrics, trace.Tracer]:
    """Install the providers once per process (OpenTelemetry allows setting them only once)."""
    global _installed
    if not _installed:
        resource = Resource.create({"service.name": service_name})
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()]))
        provider = TracerProvider(resource=resource)
        if exporter == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
        _installed = True
    return Metrics(metrics.get_meter("gateway")), trace.get_tracer("gateway")


def prometheus_text() -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
