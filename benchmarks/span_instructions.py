"""CPU instructions the gateway's tracing adds to a request, counted by callgrind: independent of the machine's load.

`gateway.tracing` alone, driven in process: per request a server span and one
upstream try's client span (what a proxied request makes), N and 5N times under
`valgrind --tool=callgrind`, the difference divided by 4N. Modes: `none` (no
exporter), `unsampled` (OTLP configured, ratio 0: what 95% of requests cost at
the default ratio), `sampled` (ratio 1: both spans built, batched, encoded and
posted to a local receiver). `--code DIR` runs another checkout's tracing.

Run: python -m benchmarks.span_instructions [--requests 200] [--code DIR] none|unsampled|sampled
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATIOS = {"none": 0.05, "unsampled": 0.0, "sampled": 1.0}


def _drive(mode: str, requests: int, endpoint: str) -> None:
    from exports_common import otel
    from exports_common.otel import TracingConfig
    from gateway.tracing import setup_tracing

    tracing = setup_tracing("gateway", TracingConfig(exporter="none" if mode == "none" else "otlp",
                                                     endpoint=endpoint, sample_ratio=RATIOS[mode]))
    for _ in range(requests):
        with tracing.server("GET", "/api/v1/exports/{task_id}", "status", {}) as request:
            with tracing.client("upstream exports", lambda: {"gateway.attempt": 1}) as upstream:
                upstream.set_attribute("http.response.status_code", 200)
            request.span.set_attribute("http.response.status_code", 200)
    otel.shutdown()


def _instructions(code: Path, mode: str, requests: int, endpoint: str) -> int:
    from benchmarks import callgrind  # not at the top: under callgrind this file runs another tree

    return callgrind.instructions([sys.executable, str(Path(__file__)), "--drive", mode, str(requests), endpoint],
                                  {"PYTHONPATH": str(code), "OTEL_BSP_SCHEDULE_DELAY": "60000"})


def main() -> None:
    if sys.argv[1:2] == ["--drive"]:
        _drive(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    from tests.otlp_receiver import OtlpReceiver

    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=list(RATIOS))
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--code", type=Path, default=ROOT)
    args = parser.parse_args()
    with OtlpReceiver() as collector:
        few = _instructions(args.code.resolve(), args.mode, args.requests, collector.url)
        many = _instructions(args.code.resolve(), args.mode, 5 * args.requests, collector.url)
    print(f"tracing {args.mode} ({args.code}): {(many - few) / (4 * args.requests):,.0f} instructions a request")


if __name__ == "__main__":
    main()
