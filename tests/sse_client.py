"""A raw-socket reader of event streams for the tests: the exact bytes the gateway sent, chunk framing removed."""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Event:
    raw: bytes  # the event's lines as sent, with the blank line that ends it
    fields: dict[str, str]

    @property
    def task(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.fields["data"])["data"]
        return data


class RawStream:
    """GET `path` on `base_url` over a socket of its own; `body` grows as `read_until` reads."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str] | None = None, timeout: float = 20.0) -> None:
        where = urlsplit(base_url)
        self.sock = socket.create_connection((where.hostname or "127.0.0.1", where.port or 80), timeout=timeout)
        lines = [f"GET {path} HTTP/1.1", f"Host: {where.netloc}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._buffer = b""
        head = self._read_head()
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.body = b""
        self.ended = False  # the body's last chunk came (a clean end)
        self.cut = False  # the connection closed without it

    def _recv(self) -> bytes:
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, TimeoutError, OSError):
            data = b""
        return data

    def _read_head(self) -> bytes:
        while b"\r\n\r\n" not in self._buffer:
            data = self._recv()
            if not data:
                raise ConnectionError(f"no answer head: {self._buffer!r}")
            self._buffer += data
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        return head

    def _dechunk(self) -> None:
        if "chunked" not in self.headers.get("transfer-encoding", ""):
            length = int(self.headers.get("content-length", "0"))
            self.body, self._buffer = self.body + self._buffer, b""
            self.ended = len(self.body) >= length
            return
        while b"\r\n" in self._buffer:
            size_line, _, rest = self._buffer.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            if size == 0:
                self.ended = True
                self._buffer = b""
                return
            self.body += rest[:size]
            self._buffer = rest[size + 2:]

    def read_until(self, done: Callable[[RawStream], bool], timeout: float = 20.0) -> RawStream:
        deadline = time.monotonic() + timeout
        self._dechunk()
        while not (done(self) or self.ended or self.cut):
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream not done within {timeout}s; body so far:\n{self.body.decode()[-2000:]}")
            self.sock.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.cut = not self.ended
                break
            self._buffer += data
            self._dechunk()
        return self

    def read_to_end(self, timeout: float = 30.0) -> RawStream:
        return self.read_until(lambda s: False, timeout)

    @property
    def events(self) -> list[Event]:
        found = []
        for block in self.body.split(b"\n\n")[:-1]:
            fields: dict[str, str] = {}
            for line in block.split(b"\n"):
                name, _, value = line.decode().partition(": ")
                if name and not name.startswith(":"):
                    fields[name] = value
            if "event" in fields:
                found.append(Event(block + b"\n\n", fields))
        return found

    def terminal(self) -> bool:
        return any(e.task["status"] in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED") for e in self.events)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
