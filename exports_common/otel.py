"""Where both processes send their spans, and which traces they record: the YAML and OpenTelemetry's variables.

The OpenTelemetry SDK reads what it reads: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
(they win over the YAML's `service_name`), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
OTEL_EXPORTER_OTLP_ENDPOINT (used when the YAML names no `endpoint`), OTEL_BSP_*. Read
here, and winning over the YAML: OTEL_TRACES_EXPORTER (none, console, otlp), which only
the SDK's automatic instrumentation reads, and OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG,
whose values the gateway needs to decide before a span starts (the SDK builds a sampler
from them, and tells no one which); OTEL_EXPORTER_OTLP_PROTOCOL is checked (http/protobuf).
"""
from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from typing import Literal, Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("exports.tracing")
SamplerName = Literal["parentbased_traceidratio", "parentbased_always_on", "parentbased_always_off",
                      "traceidratio", "always_on", "always_off"]


class TracingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exporter: Literal["none", "console", "otlp"] = Field(
        "none", description="none: ids propagate, nothing is recorded; otlp: spans to `endpoint` (http/protobuf)")
    endpoint: str | None = Field(None, description="the collector's OTLP/HTTP base URL (/v1/traces is added); "
                                                   "unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
                                                   "OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318")
    service_name: str = Field("", description="empty: the process's own name; OTEL_SERVICE_NAME wins")
    sampler: SamplerName = Field("parentbased_traceidratio", description="as OTEL_TRACES_SAMPLER names them")
    sample_ratio: float = Field(0.05, ge=0.0, le=1.0, description="share of new traces recorded")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="CIDRs whose sampled flag is obeyed; from anyone else a traceparent keeps "
                                          "its trace id and the ratio decides (parentbased_always_on obeys everyone)")

    def trusts(self, host: str | None) -> bool:
        if self.sampler == "parentbased_always_on":
            return True
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(net, strict=False) for net in self.trusted_proxies)


def from_environment(config: TracingConfig, env: Mapping[str, str] = os.environ) -> TracingConfig:
    """The config with the variables the SDK leaves to us applied; a value they cannot hold is logged and ignored."""
    changes: dict[str, object] = {}
    if exporter := env.get("OTEL_TRACES_EXPORTER"):
        changes["exporter"] = exporter.split(",")[0].strip()
    if sampler := env.get("OTEL_TRACES_SAMPLER"):
        changes["sampler"] = sampler
    if (arg := env.get("OTEL_TRACES_SAMPLER_ARG")) is not None:
        changes["sample_ratio"] = arg
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        log.error("only the http/protobuf OTLP protocol is supported; spans go out as http/protobuf",
                  extra={"protocol": protocol})
    for key, value in changes.items():
        try:
            config = TracingConfig.model_validate({**config.model_dump(), key: value})
        except ValidationError as exc:
            log.error("an OpenTelemetry variable was ignored", extra={"setting": key, "error": str(exc)})
    return config


def sampler(config: TracingConfig) -> Sampler:
    ratio = TraceIdRatioBased(config.sample_ratio)
    root: Sampler = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF, "traceidratio": ratio,
                     "parentbased_always_on": ALWAYS_ON, "parentbased_always_off": ALWAYS_OFF,
                     "parentbased_traceidratio": ratio}[config.sampler]
    return ParentBased(root) if config.sampler.startswith("parentbased") else root


def new_trace_bound(config: TracingConfig) -> int:
    """A new trace is recorded when its id's low 64 bits are under this bound (TraceIdRatioBased's rule)."""
    if config.exporter == "none" or config.sampler.endswith("always_off"):
        return 0
    if config.sampler.endswith("always_on"):
        return TraceIdRatioBased.TRACE_ID_LIMIT + 1
    return int(TraceIdRatioBased.get_bound_for_rate(config.sample_ratio))


@dataclass(frozen=True)
class Installed:
    provider: TracerProvider
    processor: SpanProcessor | None  # where ended spans go; None when nothing is exported


_installed: dict[str, Installed] = {}  # the one provider, once installed


def install(default_service: str, config: TracingConfig, decided: Sampler | None = None) -> Installed:
    """The process's tracer provider and its span processor, installed once (OpenTelemetry allows one per process).

    `decided`: the sampler of a process that decides which requests record before it starts a span (the gateway),
    instead of the one the config names.
    """
    if "installed" not in _installed:
        # the SDK's reading of OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES wins over the YAML's name
        resource = Resource.create({"service.name": config.service_name or default_service}).merge(
            OTELResourceDetector().detect())
        chosen = ALWAYS_OFF if config.exporter == "none" else decided or sampler(config)
        provider = TracerProvider(resource=resource, sampler=chosen)
        processor: SpanProcessor | None = None
        if config.exporter == "console":
            processor = SimpleSpanProcessor(ConsoleSpanExporter())
        elif config.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            endpoint = config.endpoint.rstrip("/") + "/v1/traces" if config.endpoint else None  # None: the SDK's
            # batched as OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_MAX_EXPORT_BATCH_SIZE say (5 s, 512 spans)
            processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))
        if processor is not None:
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _installed["installed"] = Installed(provider, processor)
    return _installed["installed"]


def shutdown() -> None:
    """Send the spans still queued (a process that stops otherwise loses its last second of them)."""
    for installed in _installed.values():
        installed.provider.force_flush(5000)
