"""`make run`: the backend, the gateway and the example slow service together on the embedded defaults (no Redis).

Prints where they listen and the demo credentials; Ctrl-C stops them all. GATEWAY_PORT, BACKEND_PORT and
SLOW_REPORT_PORT move them off 8080, 8081 and 8082. A port already taken (an old instance, another program)
stops it before anything starts, naming the port; a process that exits while starting or serving stops the
others and exits non-zero.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from exports_common.dev_mode import DEV_ADMIN_TOKEN
from scripts.supervise import exit_reason, stop_all, stop_on_sigterm, wait_for_any_exit

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class StackError(Exception):
    """Why the stack cannot run, said so that the user knows what to do."""


def port_taken(port: int) -> str | None:
    """Why `port` cannot be listened on now (None: it can), binding as the servers do (reuse allowed)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            sock.listen()
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_ports(ports: dict[str, int]) -> None:
    taken = [f"{name} port {port} on {HOST} is already in use ({why})"
             for name, port in ports.items() if (why := port_taken(port)) is not None]
    if taken:
        raise StackError("; ".join(taken) + ". An earlier `make run` may still be running: stop it, or free the "
                         "port, or choose others with GATEWAY_PORT=... BACKEND_PORT=... make run")


def wait_healthy(what: str, url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Return once `proc` is running and `url`/healthz answers 200; an answer while the process has exited
    (someone else's server on the port) is no success."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{what}: the process exited while starting ({exit_reason(proc.returncode)}); "
                             f"its log lines above say why")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                healthy = resp.status == 200
        except OSError:
            healthy = False
        if healthy:
            time.sleep(0.3)  # a child that lost its port to an older server exits within this
            if proc.poll() is None:
                return
            continue
        time.sleep(0.2)
    raise StackError(f"{what} did not become healthy within {timeout:.0f} s; its log lines above say why")


def _port(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name, str(default))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise StackError(f"{name}={raw!r} is not a port number")
    return int(raw)


def banner(gateway_url: str, backend_url: str, slow_url: str, admin: str) -> str:
    return f"""
Export gateway is up (DEV MODE).
  gateway:  {gateway_url}   (public API under /api/v1/exports, /metrics, /admin/*)
  backend:  {backend_url}   (only the gateway may call it: it sends the service token)
  slow report service:  {slow_url} (export type slow_report wraps it: one call per task, about 5 s)
  demo API keys:  demo -> demo-key-change-me    demo2 -> demo2-key-change-me
  admin token:    {admin}
  These are published: outside dev mode both processes refuse to start with them.

Try:
  curl -s -X POST {gateway_url}/api/v1/exports -H 'Authorization: Bearer demo-key-change-me' \\
       -H 'Content-Type: application/json' -d '{{"export_type": "order_export", "filters": {{"region": "eu-west"}}}}'
Ctrl-C stops them all.
"""


def run(env: dict[str, str], started: list[subprocess.Popen[bytes]]) -> int:
    gateway_port, backend_port = _port(env, "GATEWAY_PORT", 8080), _port(env, "BACKEND_PORT", 8081)
    slow_port = _port(env, "SLOW_REPORT_PORT", 8082)
    check_ports({"gateway": gateway_port, "backend": backend_port, "slow report service": slow_port})
    backend_url, gateway_url = f"http://{HOST}:{backend_port}", f"http://{HOST}:{gateway_port}"
    slow_url = f"http://{HOST}:{slow_port}"
    env.setdefault("EXPORT_BACKEND_URL", backend_url)
    env.setdefault("GATEWAY_PUBLIC_URL", gateway_url)
    env.setdefault("SLOW_REPORT_URL", f"{slow_url}/report")
    print(f"make run: DEV MODE is on (EXPORTS_DEV=1): the published demo keys and secrets are accepted and links "
          f"point at {env['GATEWAY_PUBLIC_URL']}. Never expose this stack; see docs/security.md.", flush=True)
    procs = [
        # the example endpoint export type slow_report wraps (docs/backend-teams/slow-endpoints.md)
        ("slow report service", slow_url, ["-m", "uvicorn", "--app-dir", "examples", "slow_report:app", "--host", HOST,
                                           "--port", str(slow_port), "--log-level", "warning"]),
        ("backend", backend_url, ["-m", "backend_stub", "run", "--config", "config/backend.yaml",
                                  "--port", str(backend_port)]),
        ("gateway", gateway_url, ["-m", "gateway", "run", "--config", "config/gateway.yaml",
                                  "--port", str(gateway_port)]),
    ]
    names: dict[int, str] = {}
    for name, url, args in procs:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env)
        started.append(proc)
        names[proc.pid] = f"{name} at {url}"
        wait_healthy(names[proc.pid], url, proc)
    print(banner(gateway_url, backend_url, slow_url, env.get("GATEWAY_ADMIN_TOKEN", DEV_ADMIN_TOKEN)), flush=True)
    stop_on_sigterm()
    wait_for_any_exit(started)
    gone = next(p for p in started if p.poll() is not None)
    raise StackError(f"{names[gone.pid]} stopped ({exit_reason(gone.returncode)}); stopping the others")


def main() -> int:
    # dev mode: the published demo secrets are accepted, which no exposed process may do
    env = dict(os.environ, EXPORTS_DEV="1")
    # the backend answers only its gateway: one token for this run, given to both (unless one is set)
    token = env.get("BACKEND_SERVICE_TOKEN") or env.get("EXPORT_BACKEND_TOKEN") or secrets.token_urlsafe(32)
    env["BACKEND_SERVICE_TOKEN"] = env["EXPORT_BACKEND_TOKEN"] = token
    started: list[subprocess.Popen[bytes]] = []
    try:
        return run(env, started)
    except StackError as exc:
        print(f"make run: FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # SIGTERM, not SIGINT: a Ctrl-C at the terminal has already sent each child a SIGINT, and uvicorn takes
        # a second SIGINT as "exit now", cancelling open streams mid-answer (tracebacks instead of a clean stop)
        stop_all(started, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
