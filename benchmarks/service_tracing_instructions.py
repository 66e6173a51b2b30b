"""Instructions per request of the backend's process with its server spans, against an earlier checkout's.

A status read (`GET /exports/{task_id}`) as the gateway sends it, counted by callgrind as
server_instructions counts the gateway's (windows of N and 5N keep-alive requests, the
difference over 4N), with tracing off, with an unsampled `traceparent` (`-00`: most calls,
at the gateway's 5 % ratio) and with a sampled one (`-01`: a server span exported to a
collector in this process). `--other DIR` (repeated) counts another checkout's backend (its
own .venv) the same way, in the same run, each kind in turn.

Run: python -m benchmarks.service_tracing_instructions --other DIR [--other DIR2] [--requests 300]
                                                       [--connections 8]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import processes
from benchmarks.server_instructions import per_request
from exports_common.task_ids import new_task_id
from tests.conftest import backend_config
from tests.helpers import wait_status
from tests.otlp_receiver import OtlpReceiver
from tests.procs import backend_headers

CALLER = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--other", type=Path, action="append", required=True,
                        help="another checkout, with its own .venv")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    with processes() as procs, OtlpReceiver() as collector, tempfile.TemporaryDirectory(prefix="btrace-") as tmp:
        served = backend_config(procs.workdir, log_level="warning")
        backend = procs.start("backend_stub", served, "backend")
        task_id = new_task_id()
        created = httpx.post(f"{backend.url}/exports", json={"export_type": "report_export"}, timeout=10,
                             headers=backend_headers("t1", **{"X-Task-Id": task_id}))
        assert created.status_code == 201, created.text
        wait_status(backend.url, task_id, {"COMPLETED"})
        backend.stop()  # the measured processes read the same store
        traced = served | {"tracing": {"exporter": "otlp", "endpoint": collector.url}}
        kinds: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("tracing off", served, {}),
            ("unsampled traceparent (-00)", traced, {"traceparent": f"00-{CALLER}-00"}),
            ("sampled traceparent (-01)", traced, {"traceparent": f"00-{CALLER}-01"})]
        for label, config, extra in kinds:
            ours = per_request("backend_stub", config, f"/exports/{task_id}", backend_headers("t1", **extra),
                               args.requests, args.connections, Path(tmp))
            print(f"{label + ':':<32}this checkout {ours:11,.0f} instructions per request")
            for root in args.other:
                theirs = per_request("backend_stub", config, f"/exports/{task_id}", backend_headers("t1", **extra),
                                     args.requests, args.connections, Path(tmp), root.resolve())
                print(f"{'':<32}{root!s} {theirs:11,.0f}   this / that {ours / theirs:.3f}")


if __name__ == "__main__":
    main()
