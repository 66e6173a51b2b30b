"""The header limit is exact whatever the server's bound says: names and values adding up to the limit pass,
one byte more gets 431, whether the header section comes in one read or several, alone or after another request
on the same keep-alive connection (the bound then counts the earlier request's bytes too)."""
from __future__ import annotations

import socket
from typing import Callable

import pytest

from tests.conftest import backend_config, gateway_config
from tests.procs import Service

LIMIT = 8192  # max_header_bytes of the shipped config


@pytest.fixture(scope="module")
def gateway(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Service:
    workdir = tmp_path_factory.mktemp("header-bound")
    backend = module_services("backend_stub", backend_config(workdir), name="backend")
    return module_services("gateway", gateway_config(workdir, backend.url), name="gateway")


def _request(host: bytes, total: int) -> bytes:
    """A GET /healthz whose header names and values add up to `total` bytes."""
    pad = b"a" * (total - len(b"host") - len(host) - len(b"x-pad"))
    return b"GET /healthz HTTP/1.1\r\nhost: " + host + b"\r\nx-pad: " + pad + b"\r\n\r\n"


def _status(sock: socket.socket) -> int:
    """The status of the next answer, read whole (head and body) so that the next one starts clean."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    assert len(body) == length
    return int(head.split(b" ", 2)[1])


@pytest.mark.parametrize("split", [False, True])
def test_the_limit_is_exact_on_a_keep_alive_connection(gateway: Service, split: bool) -> None:
    host = f"127.0.0.1:{gateway.port}".encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        for total, expected in ((LIMIT, 200), (LIMIT, 200), (LIMIT + 1, 431)):
            request = _request(host, total)
            if split:  # two sends: the server may read them apart, and counts both
                sock.sendall(request[:100])
                sock.sendall(request[100:])
            else:
                sock.sendall(request)
            assert _status(sock) == expected
