"""The OpenAPI 3.1 description of the public API, served at /openapi.json.

Export types and limits are what the plugins in force say the gateway accepts
(each plugin's `accepts` hook), so the document describes what this gateway accepts right now. The
filters of each export type are the backend's: `ExportTypesSource` asks the
backend's export-types endpoint (through the route that serves it publicly) and
the submit body becomes a union discriminated on `export_type`, one member per
type with its typed `filters`, so generated clients get typed filters. With the
backend unreachable and nothing fetched yet, `filters` is a plain object.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from pydantic.json_schema import models_json_schema

from exports_common.contract import FORMAT_PATTERN, PUBLIC_MODELS, RESULT_MEDIA_TYPES
from exports_common.errors import ErrorKind
from exports_common.task_ids import TASK_ID_PATTERN
from gateway.config import GatewayConfig, plugin_of
from gateway.plugin_registry import registry
from gateway.runtime import Runtime
from gateway.upstream import Timeouts, UpstreamError

log = logging.getLogger("gateway.openapi")
EXPORT_TYPES_PATH = "/api/v1/export-types"
FETCH_DEADLINE_SEC = 10.0
ExportTypes = list[dict[str, Any]]

NULLABLE_STR = {"type": ["string", "null"]}


def _contract_schemas() -> dict[str, Any]:
    """The public task and export type, generated from the contract's models (and the enums they use)."""
    _, doc = models_json_schema([(model, "validation") for model in PUBLIC_MODELS],
                                ref_template="#/components/schemas/{model}")
    return dict(doc["$defs"])


CONTRACT_SCHEMAS = _contract_schemas()


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


def _json(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def _errors(*statuses: int) -> dict[str, Any]:
    retry = {"Retry-After": _header("seconds to wait before trying again", {"type": "string", "pattern": r"^\d+$"})}
    out = {}
    for status in statuses:
        kinds = ", ".join(f"{k.code} {k.name}" for k in ErrorKind if k.status == status)
        out[str(status)] = _json(_ref("Error"), f"error envelope; code: {kinds}",
                                 retry if status in (409, 429, 503) else None)
    return out


def _events(summary: str, operation: str, first: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    """An event-stream operation: `text/event-stream` whose events each hold a task envelope."""
    return {"get": {
        "operationId": operation, "summary": summary,
        "description": f"Server-sent events. The stream starts with a `retry:` field, then {first}, then one "
                       "event on every change of status, progress or current_step. Each event is `event: status`, "
                       "an `id:` (the change id: send it back as `Last-Event-ID` to resume, on any gateway) and "
                       "`data:` holding what the status route would answer at that moment (the TaskEnvelope, "
                       "download link signed). A comment line comes at least every 15 s. Send the API key in "
                       "the Authorization header (a fetch-based SSE client in browsers); never in the query.",
        "parameters": [*parameters, {"name": "Last-Event-ID", "in": "header", "required": False,
                                     "description": "resume after this event id",
                                     "schema": {"type": "string", "pattern": "^[!-~]{1,128}$"}}],
        "responses": {
            "200": {"description": "the event stream", "headers": {
                        "Cache-Control": _header("no-cache"), "X-Accel-Buffering": _header("no")},
                    "content": {"text/event-stream": {"schema": {
                        "type": "string", "description": "events whose data is a TaskEnvelope"},
                        "x-event-data": _ref("TaskEnvelope")}}},
            **_errors(401, 404, 429, 502, 503, 504),
        },
    }}


def _accepts(config: GatewayConfig) -> dict[str, Any]:
    """What the plugins in force say about the bodies the gateway accepts (the first to say a thing wins)."""
    found: dict[str, Any] = {}
    for route in config.routes:
        for entry in route.plugins:
            name, settings = plugin_of(entry)
            for key, value in registry().get(name).accepts(settings).items():
                found.setdefault(key, value)
    return found


ANY_FORMAT = {"type": "string", "pattern": f"^{FORMAT_PATTERN.pattern}$",
              "description": "one of the formats the export type offers (see /api/v1/export-types); omitted: "
                             "its first"}


def _submit_properties(export_type: dict[str, Any], filters: dict[str, Any], max_timeout: int,
                       fmt: dict[str, Any]) -> dict[str, Any]:
    return {
        "export_type": export_type,
        "filters": filters,
        "callback_url": {"type": ["string", "null"], "format": "uri", "maxLength": 2048,
                         "description": "absolute http(s) URL of a public address"},
        "timeout_sec": {"type": "integer", "minimum": 1, "maximum": max_timeout, "default": 300},
        "format": fmt,
    }


def _submit_request(types: ExportTypes | None, allowed: list[str] | None, max_timeout: int) -> dict[str, Any]:
    """One schema per export type (typed filters) under a discriminated union, or one loose schema."""
    if types:
        types = [t for t in types if allowed is None or t["export_type"] in allowed]
    if not types:
        export_type: dict[str, Any] = {"type": "string", "enum": allowed} if allowed else {"type": "string",
                                                                                           "minLength": 1}
        filters: dict[str, Any] = {"type": ["object", "null"],
                                   "description": "checked per export type; a bad one is 422 naming it"}
        return {"SubmitRequest": {"type": "object", "additionalProperties": False, "required": ["export_type"],
                                  "properties": _submit_properties(export_type, filters, max_timeout, ANY_FORMAT)}}
    out: dict[str, Any] = {}
    mapping = {}
    for item in types:
        name = item["export_type"]
        mapping[name] = f"#/components/schemas/Submit_{name}"
        out[f"Filters_{name}"] = item["filters_schema"]
        filters = {"oneOf": [{"type": "null"}, _ref(f"Filters_{name}")]}
        offered = [f for f in item.get("formats", []) if isinstance(f, str)]
        fmt = {"type": "string", "enum": offered, "default": offered[0]} if offered else ANY_FORMAT
        out[f"Submit_{name}"] = {"type": "object", "additionalProperties": False, "required": ["export_type"],
                                 "properties": _submit_properties({"type": "string", "const": name}, filters,
                                                                  max_timeout, fmt)}
    out["SubmitRequest"] = {"oneOf": [{"$ref": ref} for ref in mapping.values()],
                            "discriminator": {"propertyName": "export_type", "mapping": mapping}}
    return out


def _schemas(config: GatewayConfig, types: ExportTypes | None) -> dict[str, Any]:
    accepts = _accepts(config)
    allowed = list(accepts["export_types"]) if accepts.get("export_types") else None
    max_timeout = accepts.get("max_timeout_sec", 3600)
    return {
        **_submit_request(types, allowed, max_timeout),
        **CONTRACT_SCHEMAS,
        "ExportTypesEnvelope": {
            "type": "object", "required": ["code", "message", "data"],
            "properties": {"code": {"const": 0}, "message": {"const": "success"}, "data": {
                "type": "object", "required": ["items"],
                "properties": {"items": {"type": "array", "items": _ref("ExportType")}}}}},
        "TaskEnvelope": {"type": "object", "required": ["code", "message", "data"],
                         "properties": {"code": {"const": 0}, "message": {"const": "success"}, "data": _ref("Task")}},
        "TaskListEnvelope": {
            "type": "object", "required": ["code", "message", "data"],
            "properties": {"code": {"const": 0}, "message": {"const": "success"}, "data": {
                "type": "object", "required": ["items", "next_cursor"],
                "properties": {"items": {"type": "array", "items": _ref("Task")}, "next_cursor": NULLABLE_STR}}}},
        "Error": {"type": "object", "required": ["code", "message", "data"],
                  "properties": {"code": {"type": "integer", "enum": sorted({k.code for k in ErrorKind})},
                                 "message": {"type": "string", "minLength": 1},
                                 "data": {"type": ["object", "null"]}}},
    }


FILE_CONTENT = {media_type: {"schema": {"type": "string"}} for media_type in RESULT_MEDIA_TYPES}
TASK_ID_PARAM = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"},
                 "description": f"a task id ({TASK_ID_PATTERN.pattern}); anything else is 404"}


def build(config: GatewayConfig, export_types: ExportTypes | None = None) -> dict[str, Any]:
    task = _ref("TaskEnvelope")
    poll = {"Retry-After": _header("non-terminal: seconds until the next poll (1 doubling to 30)"),
            "X-Cache": _header("HIT when answered from the terminal-status cache",
                               {"type": "string", "enum": ["HIT", "MISS"]}),
            "X-Degraded": _header("stale: the upstream could not answer; this is the last state seen"),
            "Age": _header("seconds since a stale answer was seen")}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Export gateway", "version": "1.0.0",
                 "description": "Asynchronous exports: submit, poll, cancel, download. Every JSON body is an "
                                "envelope {code, message, data}; code 0 is success."},
        "components": {"schemas": _schemas(config, export_types),
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}],
        "paths": {
            "/api/v1/exports": {
                "post": {
                    "operationId": "submitExport", "summary": "Submit an export",
                    "parameters": [
                        {"name": "Idempotency-Key", "in": "header", "required": False,
                         "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"}},
                    ],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": _ref("SubmitRequest")}}},
                    "responses": {
                        "202": _json(task, "accepted (data.degraded: stored in the outbox, delivered later)", {
                            "Location": _header("the task's status URL"),
                            "Retry-After": _header("seconds until the first poll"),
                            "Idempotent-Replayed": _header("true when this is the stored answer to an "
                                                           "earlier request with the same key")}),
                        **_errors(400, 401, 409, 413, 415, 422, 429, 502, 503, 504),
                    },
                },
                "get": {
                    "operationId": "listExports", "summary": "The caller's tasks, newest first",
                    "parameters": [
                        {"name": "status", "in": "query", "schema": _ref("Status")},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                    "maximum": 500, "default": 50}},
                        {"name": "cursor", "in": "query", "schema": {"type": "string"},
                         "description": "the next_cursor of the previous page; anything else is 422"},
                    ],
                    "responses": {"200": _json(_ref("TaskListEnvelope"), "a page of tasks"),
                                  **_errors(401, 422, 429, 502, 503, 504)},
                },
            },
            EXPORT_TYPES_PATH: {
                "get": {
                    "operationId": "listExportTypes", "summary": "The export types the caller may submit",
                    "responses": {"200": _json(_ref("ExportTypesEnvelope"),
                                               "each type with the JSON Schema of its filters"),
                                  **_errors(401, 429, 502, 503, 504)},
                },
            },
            "/api/v1/exports/{task_id}": {
                "get": {
                    "operationId": "getExport", "summary": "Poll a task",
                    "parameters": [TASK_ID_PARAM],
                    "responses": {"200": _json(task, "the task", poll), **_errors(401, 404, 429, 502, 503, 504)},
                },
            },
            "/api/v1/exports/{task_id}/events": _events(
                "Follow a task as server-sent events", "streamExportEvents",
                "an event with the task's current state at once; the stream ends after the terminal event",
                [TASK_ID_PARAM]),
            "/api/v1/events": _events(
                "Follow all of the caller's tasks as server-sent events", "streamEvents",
                "the current state of the caller's non-terminal tasks (newest first, at most 500)", []),
            "/api/v1/exports/{task_id}/cancel": {
                "post": {
                    "operationId": "cancelExport", "summary": "Cancel a PENDING or RUNNING task",
                    "parameters": [TASK_ID_PARAM],
                    "responses": {"200": _json(task, "the task, CANCELLED"),
                                  **_errors(401, 404, 409, 413, 429, 502, 503, 504)},
                },
            },
            "/api/v1/exports/{task_id}/download": {
                "get": {
                    "operationId": "downloadExport", "summary": "The result file, through its signed link",
                    "security": [{}],
                    "parameters": [
                        TASK_ID_PARAM,
                        {"name": "expires", "in": "query", "required": True, "schema": {"type": "integer"}},
                        {"name": "sig", "in": "query", "required": True, "schema": {"type": "string"}},
                        {"name": "Range", "in": "header", "required": False, "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {"description": "the file", "content": FILE_CONTENT},
                        "206": {"description": "the requested range", "content": FILE_CONTENT},
                        "307": {"description": "only with the backends' download_redirect on: the file (and its "
                                               "ranges) at a short-lived presigned object-store URL; send it no "
                                               "credentials", "headers": {"Location": {"schema": {"type": "string"}}}},
                        **_errors(401, 403, 404, 410, 429, 502, 503, 504),
                    },
                },
            },
        },
    }


class ExportTypesSource:
    """The backend's export types for the document, fetched at most every `ttl_sec`; the last good list is kept."""

    def __init__(self, ttl_sec: float = 30.0) -> None:
        self.ttl_sec = ttl_sec
        self.types: ExportTypes | None = None
        self.fetched_at = -ttl_sec

    async def get(self, runtime: Runtime) -> ExportTypes | None:
        if time.monotonic() - self.fetched_at >= self.ttl_sec:
            self.fetched_at = time.monotonic()
            self.types = await _fetch(runtime) or self.types
        return self.types


async def _fetch(runtime: Runtime) -> ExportTypes | None:
    route = next((r for r in runtime.config.routes if r.path == EXPORT_TYPES_PATH and "GET" in r.methods), None)
    if route is None or route.rewrite is None:
        return None
    upstream = runtime.services.upstreams[route.upstream]
    try:
        # a document request waits at most a few seconds for the backend, whatever the route's own read timeout,
        # and reads the answer whole within ten
        timeouts = Timeouts(connect=min(upstream.timeouts.connect, 2.0), read=min(upstream.timeouts.read, 5.0),
                            deadline=time.monotonic() + FETCH_DEADLINE_SEC)
        resp = await runtime.services.client.request("GET", upstream.url + route.rewrite, list(upstream.auth), None,
                                                     timeouts)
        body = json.loads(await resp.read())
        items = body["data"]["items"] if resp.status == 200 else None
    except (UpstreamError, ValueError, KeyError, TypeError) as exc:
        log.warning("export types unavailable for /openapi.json; filters stay untyped until the backend answers",
                    extra={"error": str(exc)})
        return None
    return items if isinstance(items, list) else None
