"""OTLP's ExportTraceServiceRequest for a batch of SDK spans, written straight in protobuf's wire format.

opentelemetry-exporter-otlp-proto's encoder builds a Python protobuf message
object for every span, attribute and value, then serialises the tree: about
130,000 instructions a span, in the export thread that shares the core with the
requests; this takes about 42,000. It writes the same bytes (tests/test_otlp_encoder.py
compares them with the library's for generated batches of every value type the SDK
allows) from the field numbers of opentelemetry/proto/trace/v1/trace.proto,
common.proto and resource.proto: proto3, fields in number order, defaults left out,
as the library's encoder sets them (a link's trace_state is not sent; a status always is).
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, TraceState
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

log = logging.getLogger("exports.tracing")

_DOUBLE = struct.Struct("<d").pack
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_ONE_BYTE = tuple(bytes((n,)) for n in range(128))
_INT64 = range(-(1 << 63), 1 << 63)
_FLAGS_HAS_IS_REMOTE, _FLAGS_IS_REMOTE = 0x100, 0x200  # SpanFlags
_KINDS = tuple(b"\x30" + _ONE_BYTE[kind.value + 1] for kind in SpanKind)  # the SDK counts from 0, OTLP from 1
_FLAGS = (_FIXED32(_FLAGS_HAS_IS_REMOTE), _FIXED32(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE))  # by is_remote


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    return tag + _varint(len(payload)) + payload


def _value(value: Any) -> bytes:
    """An AnyValue's fields; a type OTLP cannot carry raises, as the library's encoder does."""
    kind = type(value)
    if kind is str:
        return _delimited(b"\x0a", value.encode())
    if kind is int:
        return _int(value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is float:
        return b"\x21" + _DOUBLE(value)
    return _other_value(value)


def _int(value: int) -> bytes:
    if value not in _INT64:
        raise ValueError(f"{value} does not fit an int64")
    return b"\x18" + _varint(value & 0xFFFF_FFFF_FFFF_FFFF)


def _other_value(value: Any) -> bytes:
    """Subclasses of the plain types, bytes, None, arrays and maps, tried in the library's order."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _delimited(b"\x0a", str.encode(value))
    if isinstance(value, int):
        return _int(int(value))
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _delimited(b"\x3a", value)
    if isinstance(value, Sequence):
        return _delimited(b"\x2a", b"".join([_delimited(b"\x0a", _value(v)) for v in value]))
    if isinstance(value, Mapping):
        return _delimited(b"\x32", b"".join([_delimited(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


_SCALARS = (str, int, bool)  # not floats: 0.0 == -0.0
# (key, value) -> (the value's type, the KeyValue with its length before it): a process's spans repeat the same
# few attributes. Strings, ints and bools only (a list is not hashable, a tuple may hold True and 1 alike); bounded.
_kept: dict[tuple[str, Any], tuple[type, bytes]] = {}
_KEPT_MAX = 4096


def _key_value(key: str, value: Any) -> bytes:
    return (_delimited(b"\x0a", key.encode()) if key else b"") + _delimited(b"\x12", _value(value))


def _keep(item: tuple[str, Any]) -> tuple[type, bytes]:
    kind = type(item[1])
    encoded = kind, _delimited(b"", _key_value(*item))
    if kind in _SCALARS:
        if len(_kept) >= _KEPT_MAX:
            _kept.clear()
        _kept[item] = encoded
    return encoded


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated KeyValue fields; one the library would not encode is left out and logged, as it does."""
    if not attributes:
        return b""
    parts = []
    for item in attributes.items():
        try:
            kept = _kept.get(item)
        except TypeError:  # a list or a map
            kept = None
        if kept is None or kept[0] is not type(item[1]):  # True == 1 == 1.0: the type tells them apart
            try:
                kept = _keep(item)
            except Exception as exc:  # noqa: BLE001 - a value OTLP cannot carry: the span goes without it
                log.error("an attribute could not be exported", extra={"attribute": item[0], "error": str(exc)})
                continue
        parts.append(kept[1])
    return tag + tag.join(parts) if parts else b""


def _event(event: Event) -> bytes:
    time, name, dropped = event.timestamp, event.name, event.dropped_attributes
    return b"".join((b"\x09" + _FIXED64(time) if time else b"", _delimited(b"\x12", name.encode()) if name else b"",
                     _attributes(b"\x1a", event.attributes), b"\x20" + _varint(dropped) if dropped else b""))


def _link(link: Link) -> bytes:
    context, dropped = link.context, link.dropped_attributes
    return b"".join((b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big"),
                     _attributes(b"\x22", link.attributes), b"\x28" + _varint(dropped) if dropped else b"",
                     b"\x35", _FLAGS[context.is_remote]))


_CODE_ONLY = tuple(_delimited(b"\x7a", b"\x18" + _ONE_BYTE[code] if code else b"") for code in range(3))


def _status(status: Status | None) -> bytes:
    if status is None:
        return b""
    code, description = status.status_code._value_, status.description  # not .value: a Python-level descriptor
    if not description:
        return _CODE_ONLY[code]
    return _delimited(b"\x7a", _delimited(b"\x12", description.encode()) + (b"\x18" + _varint(code) if code else b""))


def _trace_state(state: TraceState) -> bytes:
    return _delimited(b"\x1a", ",".join([f"{k}={v}" for k, v in state.items()]).encode())


def _span(span: ReadableSpan) -> bytes:
    """A Span message with its length before it."""
    context, parent = span.context, span.parent
    name, start, end = span.name.encode(), span.start_time, span.end_time
    events, links, state = span.events, span.links, context.trace_state
    dropped = span.dropped_attributes, span.dropped_events, span.dropped_links
    encoded = b"".join((
        b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big"),
        _trace_state(state) if state is not DEFAULT_TRACE_STATE and state else b"",
        b"\x22\x08" + parent.span_id.to_bytes(8, "big") if parent else b"",
        b"\x2a" + _varint(len(name)) + name if name else b"",
        _KINDS[span.kind._value_],  # not the enum itself: its hash is a Python call
        b"\x39" + _FIXED64(start) if start else b"",
        b"\x41" + _FIXED64(end) if end else b"",
        _attributes(b"\x4a", span.attributes),
        b"\x50" + _varint(dropped[0]) if dropped[0] else b"",
        b"".join([_delimited(b"\x5a", _event(e)) for e in events]) if events else b"",
        b"\x60" + _varint(dropped[1]) if dropped[1] else b"",
        b"".join([_delimited(b"\x6a", _link(k)) for k in links]) if links else b"",
        b"\x70" + _varint(dropped[2]) if dropped[2] else b"",
        _status(span.status),
        b"\x85\x01", _FLAGS[bool(parent and parent.is_remote)],
    ))
    return _varint(len(encoded)) + encoded


def _string(tag: bytes, text: str | None) -> bytes:
    return _delimited(tag, text.encode()) if text else b""


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    return _string(b"\x0a", scope.name) + _string(b"\x12", scope.version) + _attributes(b"\x1a", scope.attributes)


def _scope_spans(scope: InstrumentationScope | None, spans: list[bytes]) -> bytes:
    """A ScopeSpans message: the scope, then its spans (each with its length)."""
    return b"".join((_delimited(b"\x0a", _scope(scope)), b"\x12", b"\x12".join(spans),
                     _string(b"\x1a", scope.schema_url if scope else None)))


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialised ExportTraceServiceRequest: spans grouped by resource, then by scope, in order of appearance."""
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    resource = scope = group = None  # a batch's spans mostly share both: no hashing for those
    for span in spans:
        if span.resource is not resource or span.instrumentation_scope is not scope or group is None:
            resource, scope = span.resource, span.instrumentation_scope
            group = grouped.setdefault(resource, {}).setdefault(scope or None, [])
        group.append(_span(span))
    return b"".join([_delimited(b"\x0a", b"".join((
        _delimited(b"\x0a", _attributes(b"\x0a", resource.attributes)),
        *[_delimited(b"\x12", _scope_spans(scope, encoded)) for scope, encoded in scopes.items()],
        _string(b"\x1a", resource.schema_url),
    ))) for resource, scopes in grouped.items()])
