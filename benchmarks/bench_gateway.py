"""Gateway core benchmarks (issues 3 and 16), each a ratio against a reference measured in the same run.

1. cache-hit status poll through the full plugin chain  vs  a bare Starlette app returning the same JSON
   (goal >= 0.7); each server pinned to one core and wrk to the other while measured;
2. uncached list (`GET /api/v1/exports?limit=1`: no cache, no coalescing, the signed link rewritten)
   vs  a minimal aiohttp-client proxy to the same backend (goal >= 0.8, p99 within 2x);
3. proxied status poll (cache miss: a RUNNING task, where coalescing helps) vs the same proxy (reported);
4. scaling: the cache-hit poll on `run --workers 2` vs `--workers 1`, both on one Redis, unpinned
   (goal >= 1.4x; wrk needs part of a core of the two), measured once both workers answer, with the
   connections each worker held in each run printed;
5. all of it against nginx (static answer / proxy_pass) when nginx is installed (reported, no goal);
6. CPU per proxied list call: user + sys CPU of the proxy's process(es) over a wrk run divided by the
   requests it served, for the gateway, the aiohttp proxy and nginx's proxy_pass, each in front of one
   static upstream (nginx answering the list body) so that the proxy, not the backend, is the bottleneck
   (reported, no goal; needs nginx);
7. with `--before DIR` (a checkout of another commit, e.g. `git worktree add /tmp/before main`): that
   commit's gateway against this one on the cache hit and the list call, measured in turns (what a
   change cost, as a same-run ratio).
8. with `--only frame`: the gateway against its own chains served through the libraries' frame
   (benchmarks/library_frame.py) on the cache hit (pinned) and the list call: CPU µs (user + sys of
   the process) per request over wrk runs in turns, each side's lowest round.

Every server runs on uvicorn with uvloop and httptools; the gateways with the tenant limits raised
through their environment variables (the limiter still runs on every request).

Each comparison measures its two sides in turns, round by round, and keeps each side's best round.

Run: python -m benchmarks.bench_gateway [--seconds 8] [--rounds 3] [--skip-scaling] [--before DIR]
     [--only guard|cpu|before|frame]
"""
from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

import httpx

from benchmarks import wrk
from benchmarks.harness import (
    AUTH,
    LOAD_CPU,
    Processes,
    cpu_per_request,
    nginx,
    pin,
    processes,
    submit_and_wait,
    unpin,
)
from tests.conftest import ADMIN_TOKEN, RAISED_LIMITS, backend_config, gateway_config, synthetic_type
from tests.procs import RedisServer, Service, backend_headers, free_port, wait_until

# what the gateway sends upstream (the tenant its auth found, the backend's service token); the proxies pass it on
TENANT = backend_headers("demo")
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


Target = tuple[str, dict[str, str]]  # a URL and the headers to send with it


def in_turns(rounds: int, seconds: float, targets: dict[str, Target], cpu: int | None = None
             ) -> dict[str, wrk.WrkResult]:
    """The best round of each target, the targets measured in turns: a load that comes and goes on the machine
    falls on each alike, so their ratio is a same-run figure."""
    for url, headers in targets.values():
        wrk.run(url, seconds=1, headers=headers, cpu=cpu)  # warm-up: pools, caches, page cache
    best: dict[str, wrk.WrkResult] = {}
    for _ in range(rounds):
        for label, (url, headers) in targets.items():
            result = wrk.run(url, seconds=seconds, headers=headers, cpu=cpu)
            if label not in best or result.rps > best[label].rps:
                best[label] = result
    return best


def best_of(rounds: int, url: str, seconds: float, headers: dict[str, str], cpu: int | None = None
            ) -> wrk.WrkResult:
    return in_turns(rounds, seconds, {url: (url, headers)}, cpu)[url]


def compare(label: str, ours: wrk.WrkResult, ref_label: str, ref: wrk.WrkResult, goal: str) -> None:
    print(f"{label:<34}{ours.line()}")
    print(f"{ref_label:<34}{ref.line()}")
    print(f"  ratio {ours.rps / ref.rps:.2f} ({goal}), p99 {ours.p99_ms / ref.p99_ms:.2f}x of the reference")


def serving_workers(gateway: Service, workers: int) -> list[int]:
    """The pids of a `--workers N` gateway's workers once each has answered: it answers /healthz as soon as one
    does, and each worker imports the gateway anew (seconds apart on a loaded machine)."""
    seen: set[int] = set()

    def all_answered() -> bool:  # each request on a new connection, taken by whichever worker accepts first
        seen.add(httpx.get(f"{gateway.url}/admin/stats", headers=ADMIN, timeout=5).json()["data"]["pid"])
        return len(seen) >= workers

    wait_until(all_answered, 60, interval=0.01, what=f"{workers} workers of {gateway.name} to answer")
    return sorted(seen)


def connections_by_worker(port: int, workers: list[int]) -> list[int]:
    """How many established connections to `port` each worker holds (its sockets in /proc/net/tcp)."""
    established = set()
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            established.add(f"socket:[{fields[9]}]")
    return [sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if _target(fd) in established) for pid in workers]


def _target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except FileNotFoundError:  # closed meanwhile
        return ""


class SplitWatch:
    """The connections each worker held during each load run on a `--workers N` gateway, sampled twice a second
    in a thread: wrk opens its connections at its start and keeps them, so a run's split is fixed."""

    def __init__(self, port: int, workers: list[int]) -> None:
        self.port, self.workers = port, workers
        self.splits: list[list[int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        held = False
        while not self.stop.wait(0.5):
            split = connections_by_worker(self.port, self.workers)
            if sum(split) and not held:  # a new run's connections
                self.splits.append(split)
            elif held and sum(split) >= sum(self.splits[-1]):  # the same run's, all of them open by now
                self.splits[-1] = split
            held = bool(sum(split))

    def __enter__(self) -> SplitWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def scaling(procs: Processes, backend: Service, task_id: str, rounds: int, seconds: float) -> None:
    """The hit path on one Redis with 1 and then 2 worker processes, same machine, same run."""
    redis = RedisServer(procs.workdir).start()
    try:
        targets: dict[int, Target] = {}
        gateways: dict[int, Service] = {}
        for workers in (1, 2):  # both started, measured in turns (an idle gateway costs the other nothing)
            workdir = procs.workdir / f"scaling-{workers}"
            workdir.mkdir()
            # the same config for both: gateway_processes matters only while Redis is unreachable
            config = gateway_config(workdir, backend.url, redis.url, log_level="warning", gateway_processes=2)
            gateways[workers] = procs.start("gateway", config, f"gateway-redis-{workers}w",
                                            args=("--workers", str(workers)))
            targets[workers] = (f"{gateways[workers].url}/api/v1/exports/{task_id}", AUTH)
            httpx.get(targets[workers][0], headers=AUTH)  # fills the shared cache
        two = gateways[2]
        with SplitWatch(two.port, serving_workers(two, 2)) as watch:
            best = in_turns(rounds, seconds, {str(w): target for w, target in targets.items()})
        rates = {1: best["1"], 2: best["2"]}
        print(f"cache-hit poll, Redis, 1 worker   {rates[1].line()}")
        print(f"cache-hit poll, Redis, 2 workers  {rates[2].line()}")
        print(f"  scaling {rates[2].rps / rates[1].rps:.2f}x (goal >= 1.40), "
              f"p99 {rates[2].p99_ms / rates[1].p99_ms:.2f}x of one worker")
        print(f"  connections per worker in each 2-worker run (the warm-up first): "
              f"{' '.join(str(split) for split in watch.splits)}")
    finally:
        redis.stop()


def cpu_per_call(procs: Processes, backend: Service, seconds: float, rounds: int) -> None:
    """CPU µs per proxied list call of the gateway, the aiohttp proxy and nginx, each before one static upstream."""
    listed = httpx.get(f"{backend.url}/exports?limit=1", headers=TENANT).content
    body_file = procs.workdir / "list.json"
    body_file.write_bytes(listed)
    workdir = procs.workdir / "static-upstream"
    workdir.mkdir()
    with nginx(backend.url, body_file, static_everywhere=True) as static:
        if static is None:
            print("nginx: not installed; CPU per proxied call skipped (apt-get install nginx-light)")
            return
        gateway = procs.start("gateway", gateway_config(workdir, static.url, log_level="warning"), "gateway-static")
        proxy = procs.start("benchmarks.reference_servers", {"kind": "aiohttp_proxy", "upstream": static.url},
                            "aiohttp-static")
        with nginx(static.url, body_file) as front:
            assert front is not None
            assert gateway.proc is not None and proxy.proc is not None
            targets = {"gateway": (f"{gateway.url}/api/v1/exports?limit=1", AUTH, gateway.proc.pid),
                       "aiohttp proxy": (f"{proxy.url}/exports?limit=1", TENANT, proxy.proc.pid),
                       "nginx proxy_pass": (f"{front.url}/exports?limit=1", TENANT, front.pid)}
            assert httpx.get(targets["gateway"][0], headers=AUTH).status_code == 200
            best: dict[str, tuple[float, wrk.WrkResult]] = {}
            for url, headers, _ in targets.values():
                wrk.run(url, seconds=1, headers=headers)  # warm-up
            for _ in range(rounds):  # in turns: a load that comes and goes falls on each alike
                for label, (url, headers, pid) in targets.items():
                    micros, result = cpu_per_request(pid, url, seconds, headers)
                    if label not in best or micros < best[label][0]:
                        best[label] = (micros, result)
    print("CPU per proxied list call, before one static upstream (nginx), user + sys of the proxy's process:")
    for label, (micros, result) in best.items():
        print(f"  {label:<18}{micros:7.1f} µs/call   {result.line()}")
    gateway_us = best["gateway"][0]
    print(f"  gateway / aiohttp proxy {gateway_us / best['aiohttp proxy'][0]:.2f}x, "
          f"gateway / nginx {gateway_us / best['nginx proxy_pass'][0]:.2f}x")


def removal_cost(procs: Processes, before_root: Path, backend: Service, gateway: Service, hit_path: str,
                 seconds: float, rounds: int) -> None:
    """Another commit's gateway (`before_root`) against this one on the cache hit and the list call, in turns."""
    workdir = procs.workdir / "before"
    workdir.mkdir()
    before = procs.start("gateway", gateway_config(workdir, backend.url, log_level="warning"), "gateway-before",
                         root=before_root)
    for server in (gateway, before):
        httpx.get(f"{server.url}{hit_path}", headers=AUTH)  # fills its cache
    for label, path, pinned in (("cache-hit poll", hit_path, True), ("list limit=1", "/api/v1/exports?limit=1", False)):
        best: dict[str, wrk.WrkResult] = {}
        for server in (gateway, before):
            (pin if pinned else unpin)(server)
            wrk.run(f"{server.url}{path}", seconds=1, headers=AUTH, cpu=LOAD_CPU if pinned else None)
        for _ in range(rounds):
            for name, server in (("this", gateway), ("before", before)):
                result = wrk.run(f"{server.url}{path}", seconds=seconds, headers=AUTH,
                                 cpu=LOAD_CPU if pinned else None)
                if name not in best or result.rps > best[name].rps:
                    best[name] = result
        print(f"{label + ', this commit':<34}{best['this'].line()}")
        print(f"{label + ', before':<34}{best['before'].line()}")
        print(f"  this / before {best['this'].rps / best['before'].rps:.2f}, "
              f"p99 {best['this'].p99_ms / best['before'].p99_ms:.2f}x")
    before.stop()


def frame_cost(procs: Processes, gateway: Service, hit_path: str, seconds: float, rounds: int) -> None:
    """CPU per request of the gateway and of its chains through the libraries' frame, hit and list call, in turns."""
    reference = procs.start("benchmarks.library_frame", gateway.config | {"port": free_port()}, "library-frame",
                            env=RAISED_LIMITS)
    servers = {"gateway": gateway, "library frame": reference}
    for label, path, pinned in (("cache-hit poll", hit_path, True), ("list limit=1", "/api/v1/exports?limit=1", False)):
        best: dict[str, tuple[float, wrk.WrkResult]] = {}
        for server in servers.values():
            (pin if pinned else unpin)(server)
            wrk.run(f"{server.url}{path}", seconds=1, headers=AUTH, cpu=LOAD_CPU if pinned else None)  # warm-up
        for _ in range(rounds):
            for name, server in servers.items():
                assert server.proc is not None
                micros, result = cpu_per_request(server.proc.pid, f"{server.url}{path}", seconds, AUTH,
                                                 cpu=LOAD_CPU if pinned else None)
                if name not in best or micros < best[name][0]:
                    best[name] = (micros, result)
        for name, (micros, result) in best.items():
            print(f"{label + ', ' + name:<34}{micros:7.1f} µs CPU/request   {result.line()}")
        print(f"  gateway / library frame, CPU per request {best['gateway'][0] / best['library frame'][0]:.3f}")
    reference.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    # best of three rounds a side: this machine's rate moves by about 10 % from one 8 s round to the next
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--before", type=Path, help="a checkout of another commit: its gateway against this one")
    parser.add_argument("--only", choices=["guard", "cpu", "before", "frame"],
                        help="run only that part (after the set-up); guard: the hit, the list and the scaling")
    args = parser.parse_args()
    with processes() as procs:
        workdir = procs.workdir
        backend = procs.start("backend_stub", backend_config(workdir, export_types={
            "stuck_export": synthetic_type("orders", 1000, fault={"delay_sec": 3000})}), "backend")
        gateway = procs.start("gateway", gateway_config(workdir, backend.url, log_level="warning"), "gateway")
        running = submit_and_wait(gateway.url, {"export_type": "stuck_export", "timeout_sec": 3600}, {"RUNNING"})
        # submitted last, so the newest task (what `limit=1` lists) is a finished one with a link to sign
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        hit_url = f"{gateway.url}/api/v1/exports/{done}"
        list_url = f"{gateway.url}/api/v1/exports?limit=1"
        body = httpx.get(hit_url, headers=AUTH).content
        body_file = workdir / "hit.json"
        body_file.write_bytes(body)
        assert "sig=" in httpx.get(list_url, headers=AUTH).text, "the listed task must carry a link to sign"
        bare = procs.start("benchmarks.reference_servers", {"kind": "bare", "body_file": str(body_file)}, "bare")
        proxy = procs.start("benchmarks.reference_servers", {"kind": "aiohttp_proxy", "upstream": backend.url},
                            "aiohttp-proxy")

        r = args.rounds
        if args.only == "cpu":
            cpu_per_call(procs, backend, args.seconds, r)
            return
        if args.only == "frame":
            frame_cost(procs, gateway, f"/api/v1/exports/{done}", args.seconds, r)
            return
        if args.only == "before":
            removal_cost(procs, args.before, backend, gateway, f"/api/v1/exports/{done}", args.seconds, r)
            return
        # a hit is one process's work: each server on a core of its own, wrk on the other
        for server in (gateway, bare):
            pin(server)
        hits = in_turns(r, args.seconds, {"gateway": (hit_url, AUTH),
                                          "bare": (f"{bare.url}/api/v1/exports/{done}", {})}, cpu=LOAD_CPU)
        unpin(gateway)  # a proxied call is two processes' work (gateway and backend): left to the scheduler
        lists = in_turns(r, args.seconds, {"gateway": (list_url, AUTH),
                                           "aiohttp": (f"{proxy.url}/exports?limit=1", TENANT)})
        compare("cache-hit poll, gateway", hits["gateway"], "cache-hit poll, bare Starlette", hits["bare"],
                "goal >= 0.70")
        compare("list limit=1, gateway", lists["gateway"], "list limit=1, aiohttp proxy", lists["aiohttp"],
                "goal >= 0.80, p99 <= 2.00x")
        if args.only == "guard":
            gateway.stop()
            scaling(procs, backend, done, r, args.seconds)
            return
        misses = in_turns(r, args.seconds, {"gateway": (f"{gateway.url}/api/v1/exports/{running}", AUTH),
                                            "aiohttp": (f"{proxy.url}/exports/{running}", TENANT)})
        assert httpx.get(f"{gateway.url}/api/v1/exports/{running}", headers=AUTH).headers["x-cache"] == "MISS"
        compare("cache-miss poll, gateway", misses["gateway"], "cache-miss poll, aiohttp proxy", misses["aiohttp"],
                "coalescing helps")
        if not args.skip_scaling:
            gateway.stop()  # its core is the second worker's now
            scaling(procs, backend, done, r, args.seconds)
        with nginx(backend.url, Path(body_file)) as front:
            if front is None:
                print("nginx: not installed; comparison skipped (apt-get install nginx-light)")
                return
            fronts = in_turns(r, args.seconds, {"static": (f"{front.url}/static", {}),
                                                "proxied": (f"{front.url}/exports?limit=1", TENANT)})
            print(f"{'nginx static answer':<34}{fronts['static'].line()}")
            print(f"{'nginx proxy_pass, list':<34}{fronts['proxied'].line()}")
            print(f"  gateway/nginx: cache hit {hits['gateway'].rps / fronts['static'].rps:.2f}, "
                  f"list {lists['gateway'].rps / fronts['proxied'].rps:.2f}")
        cpu_per_call(procs, backend, args.seconds, r)
        if args.before is not None:
            if not args.skip_scaling:  # the gateway measured above was stopped for the scaling part
                again = workdir / "again"
                again.mkdir()
                gateway = procs.start("gateway", gateway_config(again, backend.url, log_level="warning"),
                                      "gateway-again")
            removal_cost(procs, args.before, backend, gateway, f"/api/v1/exports/{done}", args.seconds, r)


if __name__ == "__main__":
    main()
