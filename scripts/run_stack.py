"""`make run`: the backend and the gateway together on the embedded defaults (no Redis needed).

Prints where they listen and the demo credentials; Ctrl-C stops both.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from exports_common.dev_mode import DEV_ADMIN_TOKEN, DEV_PUBLIC_URL
from exports_common.supervise import stop_all, stop_on_sigterm, wait_for_any_exit

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
    # dev mode: the published demo secrets are accepted, which no exposed process may do
    env = dict(os.environ, EXPORTS_DEV="1")
    env.setdefault("GATEWAY_PUBLIC_URL", DEV_PUBLIC_URL)
    # the backend answers only its gateway: one token for this run, given to both (unless one is set)
    token = env.get("BACKEND_SERVICE_TOKEN") or env.get("EXPORT_BACKEND_TOKEN") or secrets.token_urlsafe(32)
    env["BACKEND_SERVICE_TOKEN"] = env["EXPORT_BACKEND_TOKEN"] = token
    print(f"make run: DEV MODE is on (EXPORTS_DEV=1): the published demo keys and secrets are accepted and links "
          f"point at {env['GATEWAY_PUBLIC_URL']}. Never expose this stack; see docs/security.md.",
          flush=True)
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
        admin = env.get("GATEWAY_ADMIN_TOKEN", DEV_ADMIN_TOKEN)
        print(f"""
Export gateway is up (DEV MODE).
  gateway:  http://127.0.0.1:8080   (public API under /api/v1/exports, /metrics, /admin/*)
  backend:  http://127.0.0.1:8081   (only the gateway may call it: it sends the service token)
  demo API keys:  demo -> demo-key-change-me    demo2 -> demo2-key-change-me
  admin token:    {admin}
  These are published: outside dev mode both processes refuse to start with them.

Try:
  curl -s -X POST http://127.0.0.1:8080/api/v1/exports -H 'Authorization: Bearer demo-key-change-me' \\
       -H 'Content-Type: application/json' -d '{{"export_type": "order_export", "filters": {{"region": "eu-west"}}}}'
Ctrl-C stops both.
""", flush=True)
        stop_on_sigterm()
        wait_for_any_exit(started)
        print("a process stopped; stopping the other", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(started, signal.SIGINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
