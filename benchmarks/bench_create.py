"""Task creation rate through the backend's POST /exports with 32 concurrent clients (issue 2).

Each request carries a fresh task id (a wrk Lua script), so every one is a real insert and enqueue.
Run: python -m benchmarks.bench_create [--seconds 8]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks import wrk
from benchmarks.harness import processes
from tests.conftest import backend_config, synthetic_type
from tests.procs import SERVICE_TOKEN, RedisServer

LUA = f"""
wrk.method = "POST"
wrk.body = '{{"export_type": "tiny_export"}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Tenant-Id"] = "bench"
wrk.headers["Authorization"] = "Bearer {SERVICE_TOKEN}"
local chars = "0123456789abcdefghijklmnopqrstuvwxyz"
local counter = 0
request = function()
  counter = counter + 1
  local s = {{}}
  for i = 1, 20 do local r = math.random(1, 36); s[i] = chars:sub(r, r) end
  wrk.headers["X-Task-Id"] = "exp-20261129-" .. table.concat(s)
  return wrk.format()
end
"""

TINY = {"tiny_export": synthetic_type("report", 10)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            for store, url in (("sqlite", ""), ("redis", redis.url)):
                with processes() as procs:
                    backend = procs.start("backend_stub", backend_config(procs.workdir, url, export_types=TINY,
                                                                         log_level="warning"), "backend")
                    result = wrk.run(f"{backend.url}/exports", seconds=args.seconds, connections=32, lua=LUA)
                    print(f"create, {store:6s} store  {result.line()}")
        finally:
            redis.stop()


if __name__ == "__main__":
    main()
