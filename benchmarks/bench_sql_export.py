"""SQL export throughput and memory (issue 23): 1,000,000 rows of a PostgreSQL table to CSV, JSONL and Parquet.

Reference, in the same run: psql's `\\copy (SELECT ... ORDER BY id) TO file CSV` of the same rows (the
physical floor). Each format runs in a child process of its own: the export job (what a backend worker
runs, from the source's first query to the finished file) exports the table once to warm up, then
again, measured: rows/s (and per CPU second of the exporting process, which a loaded machine
changes less), and the growth of the peak RSS over the RSS before that second export.
Goals: CSV >= 0.10 of COPY's rows/s, JSONL >= 0.08; RSS growth < 100 MB for every format.

Run: python -m benchmarks.bench_sql_export [--rows 1000000] (TEST_POSTGRES_URL, default the machine's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from exports_common import sql
from tests.databases import POSTGRES, scratch_database

TABLE = """CREATE TABLE bench AS SELECT g::bigint AS id, 't' || (g % 7) AS tenant,
    'customer ' || (g % 1000) AS customer, g % 50 AS qty, ((g % 10000) / 100.0)::numeric(10,2) AS price,
    DATE '2026-01-01' + (g % 365) AS day, TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * INTERVAL '1 second' AS created,
    md5(g::text) AS note
    FROM generate_series(1, :rows) AS g"""


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def child(url: str, fmt: str, out_dir: str) -> None:
    """One format: a warm-up export, then the measured one; prints a JSON line."""
    from backend_stub.config import ExportTypeConfig
    from backend_stub.export_job import ExportJob
    from backend_stub.models import Task

    spec = ExportTypeConfig.model_validate({"source": {"kind": "sql", "url": url, "table": "bench", "key": "id"},
                                            "formats": [fmt]})
    spec.source.check_at_load({})  # type: ignore[union-attr]

    def export() -> tuple[int, float, float]:
        task = Task(task_id="exp-20260101-aaaaaaaaaaaaaaaa", tenant="t1", export_type="bench", filters={},
                    format=fmt, timeout_sec=3600, callback_url=None, fingerprint="", created_at=0.0, updated_at=0.0)
        job = ExportJob(spec, task, time.monotonic() + 3600, Path(out_dir) / f"bench.{fmt}", lambda path: None)
        started, cpu = time.perf_counter(), time.process_time()
        rows = job.run().rows
        return rows, time.perf_counter() - started, time.process_time() - cpu

    export()
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) to the current RSS
    before = _rss_kib("VmRSS")
    rows, seconds, cpu_seconds = export()
    size = (Path(out_dir) / f"bench.{fmt}").stat().st_size
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "growth_kib": _rss_kib("VmHWM") - before, "rss_kib": before, "bytes": size}))


def copy_reference(url: str, path: str) -> float:
    started = time.perf_counter()
    parsed = sa.engine.make_url(url)
    subprocess.run(["psql", "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432), "-U",
                    parsed.username or "postgres", "-d", parsed.database or "test", "-q", "-c",
                    f"\\copy (SELECT * FROM bench ORDER BY id) TO '{path}' CSV HEADER"], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"load before: {os.getloadavg()}")
    with scratch_database(POSTGRES, "bench_sql_export") as database, tempfile.TemporaryDirectory() as out:
        engine = sql.make_engine(database.url)
        with engine.begin() as conn:
            conn.execute(sa.text(TABLE), {"rows": args.rows})
            conn.exec_driver_sql("ALTER TABLE bench ADD PRIMARY KEY (id)")
            conn.exec_driver_sql("ANALYZE bench")
        engine.dispose()
        copy_reference(database.url, f"{out}/copy.csv")  # warm the table's pages
        for fmt in ("csv", "jsonl", "parquet"):
            copy_rate = args.rows / copy_reference(database.url, f"{out}/copy.csv")  # just before each format
            print(f"psql \\copy CSV: {copy_rate:,.0f} rows/s")
            done = subprocess.run([sys.executable, "-m", "benchmarks.bench_sql_export", "--child", database.url, fmt,
                                   out], check=True, capture_output=True, text=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rate = result["rows"] / result["seconds"]
            print(f"{fmt}: {rate:,.0f} rows/s ({result['seconds']:.2f} s) = {rate / copy_rate:.3f} of COPY; "
                  f"{result['rows'] / result['cpu_seconds']:,.0f} rows per CPU second of the exporter; "
                  f"RSS {result['rss_kib'] / 1024:.1f} MiB + peak growth {result['growth_kib'] / 1024:.1f} MiB; "
                  f"{result['bytes'] / 1e6:.1f} MB")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
