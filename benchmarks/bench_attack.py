"""Attack run (issue 9): a header flood and slowloris against the gateway, vs the same gateway unattacked.

Prints the gateway's RSS growth and /healthz p99 while under attack, against the
same figures measured in the same run without the attack:
- header flood: 8 connections at a time, each sending a header that never ends,
  reconnecting as soon as the gateway cuts it off (431);
- slowloris: 200 connections each sending one header byte every 0.5 s,
  reconnecting as soon as the gateway closes it (408 after header_timeout_sec).

Run: python -m benchmarks.bench_attack [--seconds 10]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import httpx

from benchmarks.harness import processes
from tests.conftest import backend_config, gateway_config
from tests.procs import Service

FLOOD_CONNECTIONS = 8
SLOW_CONNECTIONS = 200


def healthz_p99_ms(gateway: Service, seconds: float) -> tuple[float, int]:
    times = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            client.get("/healthz").raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.quantiles(times, n=100)[98] * 1000, len(times)


async def _flood_one(port: int, stop: threading.Event, sent: list[int]) -> None:
    chunk = b"a" * 65536
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            while not stop.is_set() and not reader.at_eof() and not writer.is_closing():
                writer.write(chunk)
                await writer.drain()
                sent[0] += len(chunk)
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            writer.close()


async def _slow_one(port: int, stop: threading.Event, closed: list[int]) -> None:
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                try:
                    if await asyncio.wait_for(reader.read(65536), 0.5) or reader.at_eof():
                        break
                except TimeoutError:
                    writer.write(b"X")
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            closed[0] += 1
            writer.close()


def attack(port: int, stop: threading.Event, sent: list[int], closed: list[int]) -> None:
    async def run() -> None:
        await asyncio.gather(*(_flood_one(port, stop, sent) for _ in range(FLOOD_CONNECTIONS)),
                             *(_slow_one(port, stop, closed) for _ in range(SLOW_CONNECTIONS)),
                             return_exceptions=True)
    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning"), "backend")
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url, log_level="warning",
                                                        connection_limits={"header_timeout_sec": 2}), "gateway")
        healthz_p99_ms(gateway, 1)  # warm-up
        rss_quiet = gateway.rss_bytes()
        quiet_p99, quiet_n = healthz_p99_ms(gateway, args.seconds)
        stop, sent, closed = threading.Event(), [0], [0]
        attacker = threading.Thread(target=attack, args=(gateway.port, stop, sent, closed))
        attacker.start()
        peak = [rss_quiet]

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], gateway.rss_bytes())
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(1)  # the attack is under way
        attacked_p99, attacked_n = healthz_p99_ms(gateway, args.seconds)
        stop.set()
        attacker.join(30)
        watcher.join()
        growth = (peak[0] - rss_quiet) / 2**20
        print(f"no attack:    /healthz p99 {quiet_p99:6.2f} ms ({quiet_n} requests), RSS {rss_quiet / 2**20:.1f} MiB")
        print(f"under attack: /healthz p99 {attacked_p99:6.2f} ms ({attacked_n} requests), RSS peak growth "
              f"{growth:.1f} MiB (goal < 20); flood sent {sent[0] / 2**20:.0f} MiB of header, "
              f"{closed[0]} slow connections cut off")
        print(f"  p99 ratio attacked / quiet {attacked_p99 / quiet_p99:.2f} (goal: attacked p99 < 50 ms)")


if __name__ == "__main__":
    main()
