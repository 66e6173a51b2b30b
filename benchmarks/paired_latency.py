"""Latency of two kinds of request measured under the same load at the same moments.

Each connection alternates between request A and request B, so both kinds meet
the same machine, the same queue and the same other traffic; what differs in
their latency is what the server does for each. wrk reports one latency for a
whole run, and two runs one after the other on a shared machine differ by more
than the paths being compared.

`run()` starts it as a program (one JSON line out) so that the load can be kept
on a core of its own; by hand:
python -m benchmarks.paired_latency URL_A URL_B --header "Authorization: Bearer ..."
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import uvloop


def _request(url: str, headers: list[str]) -> bytes:
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def _connection(host: str, port: int, requests: tuple[bytes, bytes], first: int, until: float,
                      samples: tuple[list[int], list[int]]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    kind = first
    try:
        while time.monotonic() < until:
            started = time.perf_counter_ns()
            writer.write(requests[kind])
            await _read_response(reader)
            samples[kind].append(time.perf_counter_ns() - started)
            kind = 1 - kind
    finally:
        writer.close()


def percentile(sorted_ns: list[int], share: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * share))] / 1e6


async def measure(url_a: str, url_b: str, headers: list[str], connections: int, seconds: float) -> dict[str, object]:
    parts = urlsplit(url_a)
    requests = (_request(url_a, headers), _request(url_b, headers))
    samples: tuple[list[int], list[int]] = ([], [])
    until = time.monotonic() + seconds
    await asyncio.gather(*(_connection(parts.hostname or "127.0.0.1", parts.port or 80, requests, i % 2, until,
                                       samples) for i in range(connections)))
    out: dict[str, object] = {}
    for name, kind in (("a", samples[0]), ("b", samples[1])):
        kind.sort()
        out[name] = {"requests": len(kind), "p50_ms": percentile(kind, 0.50), "p99_ms": percentile(kind, 0.99)}
    return out


@dataclass(frozen=True)
class Latency:
    requests: int
    p50_ms: float
    p99_ms: float

    def line(self) -> str:
        return f"p50 {self.p50_ms:6.2f} ms   p99 {self.p99_ms:6.2f} ms   ({self.requests} requests)"


def run(url_a: str, url_b: str, headers: dict[str, str], connections: int, seconds: float,
        cpu: int | None = None) -> tuple[Latency, Latency]:
    """Latency of A and of B, measured together; `cpu`: keep the load on that core alone."""
    cmd = [sys.executable, "-m", "benchmarks.paired_latency", url_a, url_b, "--connections", str(connections),
           "--seconds", str(seconds)]
    for name, value in headers.items():
        cmd += ["--header", f"{name}: {value}"]
    pinned = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, preexec_fn=pinned, check=True)
    result = json.loads(out.stdout)
    return Latency(**result["a"]), Latency(**result["b"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url_a")
    parser.add_argument("url_b")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    result = uvloop.run(measure(args.url_a, args.url_b, args.header, args.connections, args.seconds))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
