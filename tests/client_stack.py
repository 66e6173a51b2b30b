"""A gateway and a backend for the client SDK and CLI tests, with two extra routes that misbehave on purpose.

- `/slow/...`: the submit route with a 2.5 s `fault` delay after the idempotency
  plugin, so a client with a short timeout gives up on its first try while the
  gateway goes on and creates the task.
- `/down/...`: status answered 503 by the `fault` plugin, an outage that outlasts any retries.
"""
from __future__ import annotations

import base64
import copy
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import backend_config, gateway_config
from tests.procs import Service

SLOW_DELAY_SEC = 2.5


def _route(routes: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return copy.deepcopy(next(r for r in routes if r["name"] == name))


def _plugin_name(entry: Any) -> str:
    return entry if isinstance(entry, str) else next(iter(entry))


def misbehaving_routes(routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    slow = _route(routes, "submit")
    slow.update(name="slow_submit", path="/slow/api/v1/exports")
    after = [_plugin_name(p) for p in slow["plugins"]].index("idempotency") + 1
    slow["plugins"].insert(after, {"fault": {"delay": {"seconds": SLOW_DELAY_SEC}}})
    down = _route(routes, "status")
    down.update(name="down_status", path="/down/api/v1/exports/{task_id}",
                plugins=["auth", {"fault": {"abort": {"status": 503}}}])
    return [*routes, slow, down]


@dataclass
class ClientStack:
    backend: Service
    gateway: Service
    webhook_secret: str


def start_stack(start: Callable[..., Service], workdir: Path, public_base_url: str = "") -> ClientStack:
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    backend = start("backend_stub", backend_config(
        workdir, callbacks={"allow_networks": ["127.0.0.0/8"], "secrets": {"demo": [secret]}}))
    # the suite runs in production mode: every gateway has a public URL, its own unless one is given
    overrides: dict[str, Any] = {"public_base_url": public_base_url} if public_base_url else {}
    config = gateway_config(workdir, backend.url, **overrides)
    config["routes"] = misbehaving_routes(config["routes"])
    return ClientStack(backend, start("gateway", config), secret)


class CuttingProxy:
    """A TCP proxy in front of the gateway that, when armed, closes a download after `cut_after` bytes of it.

    The cut is real: the client sees the connection end in the middle of the body.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.target_port = 0
        self.cut_after: int | None = None
        self.cuts = 0
        self.ranges: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        # per request on this (keep-alive) connection: is it a download, and how much of its answer went out
        state = {"download": False, "sent": 0}

        def to_upstream() -> None:
            while data := _recv(client):
                if data[:4] in (b"GET ", b"POST", b"HEAD"):
                    with self.lock:
                        state.update(download=b"/download" in data.split(b"\r\n", 1)[0], sent=0)
                        if state["download"]:
                            self.ranges.extend(line.decode() for line in data.split(b"\r\n")
                                               if line.lower().startswith(b"range:"))
                upstream.sendall(data)
            _close(upstream)

        threading.Thread(target=to_upstream, daemon=True).start()
        while data := _recv(upstream):
            with self.lock:
                limit = self.cut_after if state["download"] else None
                if limit is not None and state["sent"] + len(data) >= limit:
                    data = data[: limit - state["sent"]]
                    self.cut_after = None  # one cut per arming
                    self.cuts += 1
                else:
                    limit = None
                state["sent"] += len(data)
            client.sendall(data)
            if limit is not None:
                break
        _close(client)
        _close(upstream)

    def close(self) -> None:
        self.listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
