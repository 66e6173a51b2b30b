"""A collector for the tests: accepts OTLP/HTTP protobuf on /v1/traces and keeps the spans it is sent.

Requests are kept as they came and decoded when the spans are read: decoding thousands of spans a second
as they arrive took a few per cent of a core from the benchmark it served (bench_tracing measures the
exporting gateway, not its collector).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # the trace ids linked to


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "int_value", "bool_value", "double_value") else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._received: list[bytes] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                else:
                    with receiver.lock:
                        receiver._received.append(body)
                    self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def spans(self) -> list[Span]:
        """Every span received so far."""
        with self.lock:
            received, self._received = self._received, []
            for body in received:  # each request decoded once, even if a later one fails to decode
                self._keep(ExportTraceServiceRequest.FromString(body))
            return list(self._spans)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self._spans.append(Span(
                        service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                        _attributes(s.attributes), [(e.name, _attributes(e.attributes)) for e in s.events],
                        [link.trace_id.hex() for link in s.links]))

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of_trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]
