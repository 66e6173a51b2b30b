"""What exporting traces costs: status polls with spans sent to a collector at the default ratio vs tracing off.

Two gateways on one backend, identical but for `tracing`: one exports over
OTLP/HTTP to a local receiver (tests/otlp_receiver.py) at the default sample
ratio (0.05), the other has no exporter. The backend exports too (it records the
traces the gateway samples). Same run, alternating rounds, best of each:
- cache hit (each gateway pinned to one core, wrk on the other; goal >= 0.95);
- cache miss, proxied to the backend (goal >= 0.9).
With `--before DIR` (a checkout of an earlier commit with its own .venv), a third
gateway runs that code with no exporter: this code against it, no exporter on
either, is the "no slower than before" row.

Run: python -m benchmarks.bench_tracing [--seconds 8] [--rounds 2] [--before DIR]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import httpx

from benchmarks import wrk
from benchmarks.harness import AUTH, LOAD_CPU, pin, processes, submit_and_wait, unpin
from tests.conftest import backend_config, gateway_config, synthetic_type
from tests.otlp_receiver import OtlpReceiver


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with, with its .venv")
    args = parser.parse_args()
    with OtlpReceiver() as collector, processes() as procs:
        workdir = procs.workdir
        exporting = {"exporter": "otlp", "endpoint": collector.url}  # the default ratio, 0.05
        backend = procs.start("backend_stub", backend_config(workdir, tracing=exporting, export_types={
            "stuck_export": synthetic_type("orders", 1000, fault={"delay_sec": 3000})}), "backend")
        gateways = {
            "off": procs.start("gateway", gateway_config(workdir / "off", backend.url, log_level="warning"), "off"),
            "otlp": procs.start("gateway", gateway_config(workdir / "otlp", backend.url, log_level="warning",
                                                          tracing=exporting), "otlp"),
        }
        if args.before:
            before = gateway_config(workdir / "before", backend.url, log_level="warning")
            before["tracing"] = {"exporter": "none"}  # the settings the earlier code knows
            gateways["before"] = procs.start("gateway", before, "before", root=args.before.resolve())
        done = submit_and_wait(gateways["off"].url, {"export_type": "report_export"}, {"COMPLETED"})
        running = submit_and_wait(gateways["off"].url, {"export_type": "stuck_export", "timeout_sec": 3600},
                                  {"RUNNING"})
        hits: dict[str, list[wrk.WrkResult]] = {name: [] for name in gateways}
        misses: dict[str, list[wrk.WrkResult]] = {name: [] for name in gateways}
        for gateway in gateways.values():  # warm-up
            wrk.run(f"{gateway.url}/api/v1/exports/{done}", seconds=1, headers=AUTH)
            wrk.run(f"{gateway.url}/api/v1/exports/{running}", seconds=1, headers=AUTH)
        for _ in range(args.rounds):
            for name, gateway in gateways.items():
                pin(gateway)
                hits[name].append(wrk.run(f"{gateway.url}/api/v1/exports/{done}", seconds=args.seconds,
                                          headers=AUTH, cpu=LOAD_CPU))
                unpin(gateway)
                misses[name].append(wrk.run(f"{gateway.url}/api/v1/exports/{running}", seconds=args.seconds,
                                            headers=AUTH))
        assert httpx.get(f"{gateways['otlp'].url}/api/v1/exports/{running}", headers=AUTH).headers["x-cache"] == "MISS"
        best = {kind: {name: max(results, key=lambda r: r.rps) for name, results in runs.items()}
                for kind, runs in (("hit", hits), ("miss", misses))}
        for kind, goal in (("hit", 0.95), ("miss", 0.9)):
            off, otlp = best[kind]["off"], best[kind]["otlp"]
            print(f"cache {kind}, tracing off      {off.line()}")
            print(f"cache {kind}, OTLP at 0.05     {otlp.line()}")
            print(f"  ratio {otlp.rps / off.rps:.2f} (goal >= {goal})")
            if "before" in best[kind]:
                earlier = best[kind]["before"]
                print(f"cache {kind}, before, no exporter {earlier.line()}")
                print(f"  this code / before, no exporter on either: {off.rps / earlier.rps:.2f} (goal >= 1.0)")
        traces = {s.trace_id for s in collector.spans}
        print(f"spans received: {len(collector.spans)} in {len(traces)} traces")


if __name__ == "__main__":
    main()
