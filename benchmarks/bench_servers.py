"""The server choice (issue 16): the gateway's cache-hit poll on uvicorn and on granian, 1 and 2 workers.

All in one run, unpinned (2 workers need both cores; wrk takes part of one): uvicorn as
`python -m gateway run [--workers 2]` (its bounded protocol, uvloop, httptools), granian
as `granian --interface asgi --loop uvloop [--workers 2]` on the same app and config.
One worker runs on the embedded default and on Redis, two workers on Redis (required).

Run: python -m benchmarks.bench_servers [--seconds 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

import yaml

from benchmarks.bench_gateway import best_of
from benchmarks.harness import AUTH, processes, submit_and_wait
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import SERVICE_TOKEN_ENV, RedisServer, stand_in


@contextlib.contextmanager
def granian(config: dict[str, object], workdir: Path, name: str, workers: int) -> Iterator[str]:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = int(str(config["port"]))
    command = [str(Path(sys.executable).parent / "granian"), "--interface", "asgi", "--loop", "uvloop",
               "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--no-access-log",
               "--log-level", "warning", "benchmarks.granian_gateway:app"]
    env = dict(os.environ, **RAISED_LIMITS, **SERVICE_TOKEN_ENV, GATEWAY_CONFIG=str(path))
    with stand_in(command, port, name, env=env, log=workdir / f"{name}.log", timeout=30) as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with processes() as procs:
        workdir = procs.workdir
        redis = RedisServer(workdir).start()
        try:
            backend = procs.start("backend_stub", backend_config(workdir), "backend")
            first = procs.start("gateway", gateway_config(workdir, backend.url, log_level="warning"), "first")
            done = submit_and_wait(first.url, {"export_type": "report_export"}, {"COMPLETED"})
            first.stop()
            path = f"/api/v1/exports/{done}"

            def config(redis_url: str) -> dict[str, object]:
                return gateway_config(workdir, backend.url, redis_url, log_level="warning", gateway_processes=2)

            rows = {}
            for label, redis_url, workers in (("embedded, 1 worker", "", 1), ("Redis, 1 worker", redis.url, 1),
                                              ("Redis, 2 workers", redis.url, 2)):
                gateway = procs.start("gateway", config(redis_url), f"uvicorn-{workers}-{bool(redis_url)}",
                                      args=("--workers", str(workers)))
                rows[f"uvicorn, {label}"] = best_of(args.rounds, gateway.url + path, args.seconds, AUTH)
                gateway.stop()
                with granian(config(redis_url), workdir, f"granian-{workers}-{bool(redis_url)}", workers) as url:
                    rows[f"granian, {label}"] = best_of(args.rounds, url + path, args.seconds, AUTH)
        finally:
            redis.stop()
    base = rows["uvicorn, embedded, 1 worker"]
    for label, result in rows.items():
        print(f"{label:<32}{result.line()}   {result.rps / base.rps:.2f}x")


if __name__ == "__main__":
    main()
