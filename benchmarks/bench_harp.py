"""The gateway against HARP (harp-proxy, the maintained Python API proxy) on the same uncached call, same run.

HARP needs Python 3.13 and cannot be installed beside the gateway (3.11), so it is
run from a virtual environment of its own, named by `--harp` (or HARP_BIN):

    python3.13 -m venv /opt/harp && /opt/harp/bin/pip install harp-proxy
    python -m benchmarks.bench_harp --harp /opt/harp/bin/harp [--seconds 8] [--rounds 2]

Both serve `GET /exports?limit=1` from the same backend, the gateway through its
`list` route (limits raised, as in every benchmark; the limiter still runs), HARP
as its own `server` command runs it with one endpoint and its defaults but the
dashboard (its transaction storage and access log included: what a user gets).
Goal (issue 16): the gateway at least 10x HARP's requests/s. Neither is pinned, as
in bench_gateway's list comparison: a proxied call is two processes' work.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import httpx

from benchmarks.bench_gateway import TENANT, best_of
from benchmarks.harness import AUTH, processes, submit_and_wait
from tests.conftest import backend_config, gateway_config
from tests.procs import free_port, wait_until


@contextlib.contextmanager
def harp(binary: Path, upstream: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    log = (workdir / "harp.log").open("w")
    env = os.environ | {"PATH": f"{binary.parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen([str(binary), "server", "--endpoint", f"backend={port}:{upstream}/",
                             "--disable", "dashboard"], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/exports?limit=1", headers=TENANT).status_code == 200, 90,
                   interval=0.5, what="HARP to serve the list call")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--harp", type=Path, default=os.environ.get("HARP_BIN"))
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.harp is None or not args.harp.exists():
        raise SystemExit("HARP is not installed: see this module's docstring (--harp or HARP_BIN)")
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir), "backend")
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url, log_level="warning"), "gateway")
        submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        with harp(args.harp, backend.url, procs.workdir) as harp_url:
            ours = best_of(args.rounds, f"{gateway.url}/api/v1/exports?limit=1", args.seconds, AUTH)
            theirs = best_of(args.rounds, f"{harp_url}/exports?limit=1", args.seconds, TENANT)
    print(f"{'list limit=1, gateway':<34}{ours.line()}")
    print(f"{'list limit=1, HARP':<34}{theirs.line()}")
    print(f"  gateway / HARP {ours.rps / theirs.rps:.1f}x (goal >= 10x), p99 {ours.p99_ms / theirs.p99_ms:.2f}x")


if __name__ == "__main__":
    main()
