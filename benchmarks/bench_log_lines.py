"""One JSON log line's instructions: the gateway's formatter (exports_common/jsonlog.py, python-json-logger's with
the line's fields) against python-json-logger's configured alone.

Each formatter formats N access-log records (the fields `gateway/access_log.py` writes, with the request and trace
ids in their context variables) in a child process under `valgrind --tool=callgrind`, with N and 0 records; the
difference over N is one line's cost, record creation included (the same for both). The bare python-json-logger gets
the ids from a filter reading the context variables; the gateway's formatter reads them itself.

    python -m benchmarks.bench_log_lines [--lines 2000]
"""
from __future__ import annotations

import argparse
import logging

from benchmarks.callgrind import per_operation
from exports_common import jsonlog

IDS = {"request_id": jsonlog.request_id_var, "trace_id": jsonlog.trace_id_var, "task_id": jsonlog.task_id_var}
EXTRA = {"request_id": "req-1", "trace_id": "0af7651916cd43dd8448eb211c80319c", "tenant": "demo", "route": "status",
         "method": "GET", "path": "/api/v1/exports/exp_1", "status": 200, "duration_ms": 1.234, "attempts": 1,
         "cache": "HIT", "task_id": "exp_1", "client": "127.0.0.1"}
FORMATTERS = ("jsonlog", "python-json-logger")


class ContextIds(logging.Filter):
    """The request's ids from their context variables onto the record, as the gateway's formatter reads them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, var in IDS.items():
            if key not in record.__dict__ and (value := var.get()):
                setattr(record, key, value)
        return True


def formatter(name: str) -> tuple[logging.Formatter, logging.Filter | None]:
    if name == "jsonlog":
        return jsonlog.JsonFormatter(), None
    from pythonjsonlogger.json import JsonFormatter

    renamed = {"levelname": "level", "name": "logger", "message": "msg"}
    return JsonFormatter("{levelname}{name}{message}", style="{", rename_fields=renamed, timestamp="ts"), ContextIds()


def format_lines(name: str, lines: int) -> None:
    """The child: `lines` access records formatted by `name`."""
    jsonlog.request_id_var.set("req-1")
    jsonlog.trace_id_var.set("0af7651916cd43dd8448eb211c80319c")
    fmt, ids = formatter(name)
    log = logging.getLogger("gateway.access")
    written = 0
    for _ in range(lines):
        record = log.makeRecord(log.name, logging.INFO, __file__, 1, "request", (), None, extra=EXTRA)
        if ids is not None:
            ids.filter(record)
        written += len(fmt.format(record))
    print(written)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--child", nargs=2, metavar=("FORMATTER", "LINES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        format_lines(args.child[0], int(args.child[1]))
        return
    counted = {name: per_operation("benchmarks.bench_log_lines", [name], args.lines) for name in FORMATTERS}
    for name, count in counted.items():
        print(f"{name}: {count:,.0f} instructions per line ({count / counted['jsonlog']:.2f}x jsonlog)")


if __name__ == "__main__":
    main()
