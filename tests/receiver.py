"""A real HTTP server in the test process that receives callbacks and answers as told."""
from __future__ import annotations

import contextlib
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    at: float
    headers: dict[str, str]
    body: bytes


class Receiver:
    def __init__(self, statuses: list[int] | None = None, delay_sec: float = 0.0) -> None:
        self.statuses = list(statuses or [])  # answered in order; 204 once they run out
        self.delay_sec = delay_sec
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.received.append(Received(time.monotonic(), {k.lower(): v for k, v in self.headers.items()},
                                                      body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 204
                time.sleep(receiver.delay_sec)  # a slow receiver, for the tests that need one
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/exports"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self) -> int:
        with self.lock:
            return len(self.received)


class HostileReceiver:
    """A callback receiver that misbehaves at the socket level, each connection the same way.

    reset: closes with a TCP RST at once. silent: reads and never answers. slow: sends its
    status line one byte a second. huge: answers 500 with an endless body.
    """

    MODES = ("reset", "silent", "slow", "huge")

    def __init__(self, mode: str) -> None:
        assert mode in self.MODES
        self.stop = threading.Event()
        receiver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    conn.recv(65536)
                    if mode == "reset":
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    elif mode == "huge":
                        conn.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 100000000000\r\n\r\n")
                        while not receiver.stop.is_set():
                            conn.sendall(b"x" * 65536)
                    else:
                        for byte in b"HTTP/1.1 200 OK\r\n" if mode == "slow" else b"":
                            if receiver.stop.wait(1.0):
                                return
                            conn.sendall(bytes([byte]))
                        receiver.stop.wait(60)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{mode}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HostileReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
