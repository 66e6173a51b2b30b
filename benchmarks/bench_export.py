"""Export throughput and memory (issue 2): a 1,000,000-row CSV export by the real backend.

Reference, in the same run: a bare loop writing the same generated rows with csv.writer.
Goals: at least 0.5 of the bare loop's rows/s; backend peak RSS under 150 MiB.
Run: python -m benchmarks.bench_export [--rows 1000000]
"""
from __future__ import annotations

import argparse
import csv
import time

import httpx

from backend_stub.datasets import DATASETS
from benchmarks.harness import processes
from exports_common.task_ids import new_task_id
from tests.conftest import backend_config, synthetic_type
from tests.procs import backend_headers


def bare_loop(rows: int, seed: int, path: str) -> float:
    started = time.perf_counter()
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(DATASETS["orders"].columns)
        writer.writerows(DATASETS["orders"].generate(seed, rows))
    return rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    seed = 11
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, export_types={
            "bench_export": synthetic_type("orders", args.rows, seed)}), "backend")
        reference = bare_loop(args.rows, seed, str(procs.workdir / "bare.csv"))
        idle_rss = backend.rss_bytes()
        task_id = new_task_id()
        started = time.perf_counter()
        httpx.post(f"{backend.url}/exports", json={"export_type": "bench_export"},
                   headers=backend_headers("bench", **{"X-Task-Id": task_id})).raise_for_status()
        peak = idle_rss
        while True:
            peak = max(peak, backend.rss_bytes())
            data = httpx.get(f"{backend.url}/exports/{task_id}", headers=backend_headers("bench")).json()["data"]
            if data["status"] not in ("PENDING", "RUNNING"):
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        assert data["status"] == "COMPLETED", data
        product = args.rows / elapsed
        print(f"bare csv.writer loop     {reference:10.0f} rows/s")
        print(f"backend export (e2e)     {product:10.0f} rows/s   {elapsed:.2f} s for {args.rows} rows, "
              f"{data['result']['bytes'] / 2**20:.1f} MiB")
        print(f"  ratio {product / reference:.2f} (goal >= 0.50)")
        print(f"backend RSS idle {idle_rss / 2**20:.1f} MiB, peak during export {peak / 2**20:.1f} MiB "
              f"(goal < 150 MiB)")


if __name__ == "__main__":
    main()
