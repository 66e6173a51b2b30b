"""Structured logs: one JSON object per line (python-json-logger), with trace and task ids when known."""
from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Any, Protocol

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as LibraryJsonFormatter

task_id_var: ContextVar[str | None] = ContextVar("task_id", default=None)
trace_id_var: ContextVar[str | None] = ContextVar("trace_id", default=None)
request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
_VARS = {"trace_id": trace_id_var, "task_id": task_id_var, "request_id": request_id_var}


class LogIds(Protocol):
    """The ids of the request being answered, looked up by name (a dict, or an object finding them when asked)."""

    def get(self, key: str) -> str | None: ...


# set at once (one context variable set per request, not three); read only when a line is written
request_ids_var: ContextVar[LogIds | None] = ContextVar("request_ids", default=None)


class JsonFormatter(LibraryJsonFormatter):
    """`{"ts": <Unix seconds>, "level": "info", "logger", "msg", the ids, the record's extra fields, "exc"}`.

    The ids: a record's own field first, else the backend's context variables, else the request's `request_ids_var`.
    """

    def __init__(self) -> None:
        super().__init__(["levelname", "name", "message"],
                         rename_fields={"levelname": "level", "name": "logger", "message": "msg", "exc_info": "exc"},
                         reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's copy of the message
                         json_default=str)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data["ts"] = round(record.created, 3)
        super().add_fields(log_data, record, message_dict)
        log_data["level"] = record.levelname.lower()
        ids = request_ids_var.get()
        for key, var in _VARS.items():
            if not record.__dict__.get(key) and (value := var.get() or (ids.get(key) if ids is not None else None)):
                log_data[key] = value
        if "exc" in log_data:  # the traceback last, after the ids
            log_data["exc"] = log_data.pop("exc")


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
