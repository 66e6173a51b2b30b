"""A log line written while a request is answered names the request, its trace and its task."""
from __future__ import annotations

import contextvars
import json
import logging

import pytest

from exports_common.jsonlog import JsonFormatter, request_ids_var, task_id_var

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it


def line(**extra: str) -> dict[str, str]:
    record = logging.LogRecord("gateway", logging.WARNING, __file__, 1, "upstream failed", None, None)
    record.__dict__.update(extra)
    return dict(json.loads(JsonFormatter().format(record)))


def test_a_request_s_ids_reach_its_log_lines() -> None:
    def inside() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        request_ids_var.set({"request_id": "r-1", "trace_id": "t" * 32, "task_id": None})
        first = line()
        task_id_var.set("exp-1")  # the backend's own variable still counts, and a record's field first
        return first, line(), line(request_id="r-2")

    first, second, third = contextvars.copy_context().run(inside)
    assert (first["request_id"], first["trace_id"], "task_id" in first) == ("r-1", "t" * 32, False)
    assert second["task_id"] == "exp-1" and third["request_id"] == "r-2"
    assert "request_id" not in line()  # outside any request
