"""Structured logs: one JSON object per line, with trace and task ids when known."""
from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, Protocol

task_id_var: ContextVar[str | None] = ContextVar("task_id", default=None)
trace_id_var: ContextVar[str | None] = ContextVar("trace_id", default=None)
request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
_VARS = {"trace_id": trace_id_var, "task_id": task_id_var, "request_id": request_id_var}


class LogIds(Protocol):
    """The ids of the request being answered, looked up by name (a dict, or an object finding them when asked)."""

    def get(self, key: str) -> str | None: ...


# set at once (one context variable set per request, not three); read only when a line is written
request_ids_var: ContextVar[LogIds | None] = ContextVar("request_ids", default=None)

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ids = request_ids_var.get()
        for key, var in _VARS.items():
            value = record.__dict__.get(key) or var.get() or (ids.get(key) if ids is not None else None)
            if value:
                out[key] = value
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in out})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


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
