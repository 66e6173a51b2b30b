"""`make run`: the backend and the gateway together on the embedded defaults (no Redis needed).

Prints where they listen and the demo credentials; Ctrl-C stops both.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wait_healthy(what: str, url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what}: the process exited with {proc.returncode}; see its log above")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not become healthy within {timeout:.0f} s")


def main() -> int:
    env = dict(os.environ)
    procs = [
        ("backend", "http://127.0.0.1:8081", ["-m", "backend_stub", "run", "--config", "config/backend.yaml"]),
        ("gateway", "http://127.0.0.1:8080", ["-m", "gateway", "run", "--config", "config/gateway.yaml"]),
    ]
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, url, args in procs:
            proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env)
            started.append(proc)
            wait_healthy(f"{name} at {url}", url, proc)
        admin = env.get("GATEWAY_ADMIN_TOKEN", "admin-change-me")
        print(f"""
Export gateway is up.
  gateway:  http://127.0.0.1:8080   (public API under /api/v1/exports, /metrics, /admin/*)
  backend:  http://127.0.0.1:8081
  demo API keys:  demo -> demo-key-change-me    demo2 -> demo2-key-change-me
  admin token:    {admin}
  CHANGE the keys, the admin token and DOWNLOAD_SIGNING_SECRET before exposing the gateway.

Try:
  curl -s -X POST http://127.0.0.1:8080/api/v1/exports -H 'Authorization: Bearer demo-key-change-me' \\
       -H 'Content-Type: application/json' -d '{{"export_type": "order_export", "filters": {{"region": "eu-west"}}}}'
Ctrl-C stops both.
""", flush=True)
        _wait(started)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in reversed(started):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _wait(started: list[subprocess.Popen[bytes]]) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    while all(p.poll() is None for p in started):
        time.sleep(0.5)
    print("a process stopped; stopping the other", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
