"""`make bench`: every benchmark in turn, with their output as-is."""
from __future__ import annotations

import subprocess
import sys

SCRIPTS = ["bench_export", "bench_create", "bench_upstream_client", "bench_gateway", "bench_servers",
           "bench_client_polling", "bench_limiter", "bench_noisy_neighbour"]

if __name__ == "__main__":
    for name in SCRIPTS:
        print(f"== benchmarks.{name}", flush=True)
        subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *sys.argv[1:]], check=True)
