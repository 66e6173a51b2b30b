"""The library's OTLP/HTTP span exporter with one step replaced: the request is written by `otlp_encoder`.

Everything else is the library's own: its HTTP session, retries and back-off,
timeout, compression, headers, size limit, self-metrics and shutdown. Only
`export` is overridden (the library encodes inline there); its body is the
library's (opentelemetry-exporter-otlp-proto-http 1.45) with the encoder swapped,
and the end-to-end trace tests send through it to a real receiver.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError, _is_request_too_large
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from exports_common import otlp_encoder

log = logging.getLogger("exports.tracing")


class SpanExporter(OTLPSpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return super().export(spans)  # refused and logged as the library does
        with self._metrics.export_operation(len(spans)) as result:
            try:
                request = otlp_encoder.encode(spans)
            except Exception as exc:  # noqa: BLE001 - a span OTLP cannot carry fails its batch, as in the library
                log.error("a span batch could not be encoded", extra={"error": str(exc), "spans": len(spans)})
                result.error = exc
                return SpanExportResult.FAILURE
            if _is_request_too_large(request, self._max_request_size):
                log.warning("a span batch over the exporter's max_request_size was dropped",
                            extra={"bytes": len(request), "limit": self._max_request_size})
                result.error = RequestPayloadTooLargeError(f"{len(request)} bytes over {self._max_request_size}")
                return SpanExportResult.FAILURE
            sent = self._client.export(request)
            if not sent.success:
                result.error = sent.error
                result.error_attrs = {"http.response.status_code": sent.status_code} if sent.status_code else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
