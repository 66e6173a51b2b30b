"""The gateway's upstream client on the route it serves: the list call with it and with aiohttp's ClientSession.

Two gateways on the same config before one backend: the gateway as it is, and the same
gateway with aiohttp's `ClientSession` as its upstream client (benchmarks/aiohttp_upstream.py).
Their answers to the uncached list call (`GET /api/v1/exports?limit=1`: the signed link
rewritten, proxied every time) are compared first (status, body, echoed `x-request-id`);
then wrk runs on each in turns, round by round (the order turns each round, so a load that
comes and goes falls on both alike), unpinned, as the backend's work is part of each call:

- CPU µs per request: user + sys of the gateway's process over the run, divided by the requests;
- p99 (and rate) from the same run.

Each side's best round (lowest CPU per request) is reported, with its p99, then each side's
median and lowest p99 over the rounds (a p99 moves more from round to round than the CPU
does), and every round's figures. Instruction counts of the same two servers, load-independent:
`python -m benchmarks.server_instructions --aiohttp-client`.

Run: python -m benchmarks.bench_upstream_route [--seconds 8] [--rounds 5] [--connections 32]
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks import wrk
from benchmarks.harness import AUTH, cpu_per_request, processes
from benchmarks.server_instructions import LIST_PATH, same_answers
from tests.conftest import RAISED_LIMITS, backend_config, gateway_config
from tests.procs import Service, free_port

Round = tuple[float, wrk.WrkResult]  # CPU µs per request, and wrk's figures


def measure(server: Service, seconds: float, connections: int) -> Round:
    assert server.proc is not None
    return cpu_per_request(server.proc.pid, f"{server.url}{LIST_PATH}", seconds, AUTH, connections)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir), "backend")
        served = gateway_config(procs.workdir, backend.url, log_level="warning")
        servers = {"gateway's client": procs.start("gateway", served, "gateway"),
                   # the gateway's public URL too (signed links name it): only the port differs
                   "aiohttp ClientSession": procs.start("benchmarks.aiohttp_upstream", served | {"port": free_port()},
                                                        "aiohttp-client", env=RAISED_LIMITS)}
        one, other = servers.values()
        same_answers(one.url, other.url, [LIST_PATH, LIST_PATH])
        for server in servers.values():
            wrk.run(f"{server.url}{LIST_PATH}", seconds=1, connections=args.connections, headers=AUTH)  # warm-up
        rounds: dict[str, list[Round]] = {label: [] for label in servers}
        for n in range(args.rounds):
            order = list(servers.items())
            for label, server in order[n % 2:] + order[:n % 2]:
                rounds[label].append(measure(server, args.seconds, args.connections))
                micros, result = rounds[label][-1]
                print(f"round {n + 1}, {label + ':':<24}{micros:7.1f} µs CPU/request   {result.line()}")
    best = {label: min(runs, key=lambda run: run[0]) for label, runs in rounds.items()}
    print(f"list call ({LIST_PATH}), each side's best round, {args.rounds} rounds of {args.seconds:g} s, "
          f"{args.connections} connections:")
    for label, (micros, result) in best.items():
        print(f"  {label + ':':<24}{micros:7.1f} µs CPU/request   {result.line()}")
    (ours, our_run), (theirs, their_run) = best.values()
    print(f"  gateway's client / aiohttp ClientSession: CPU per request {ours / theirs:.3f}, "
          f"p99 {our_run.p99_ms / their_run.p99_ms:.3f}x")
    p99s = {label: [result.p99_ms for _, result in runs] for label, runs in rounds.items()}
    for label, values in p99s.items():
        print(f"  {label + ':':<24}p99 over the rounds: median {statistics.median(values):6.2f} ms, "
              f"lowest {min(values):6.2f} ms")
    (our_p99, their_p99) = p99s.values()
    print(f"  gateway's client / aiohttp ClientSession: median p99 "
          f"{statistics.median(our_p99) / statistics.median(their_p99):.3f}x, lowest p99 "
          f"{min(our_p99) / min(their_p99):.3f}x")


if __name__ == "__main__":
    main()
