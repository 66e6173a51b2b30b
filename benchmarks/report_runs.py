"""The measurements behind `python -m benchmarks.report` (docs/performance.md), one function per section.

Every figure is a ratio or a count taken in one run on real processes (gateway, backend, private
redis-server) on free ports, loaded by wrk or, where the client is the product (the SDK), by the
SDK itself. Each section returns the markdown it contributes to the page.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks import wrk
from benchmarks.fill_windows import CallSampler, Windows, windowed
from benchmarks.harness import AUTH, Processes, processes, submit_and_wait
from exports_client import ExportsClient
from exports_common.config_loader import ConfigError, interpolate, validate_data
from gateway.config import GatewayConfig
from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import backend_requests
from tests.procs import RedisServer, Service, backend_headers, wait_until

API = "/api/v1/exports"
# never finishes by itself: its tasks hold a worker (RUNNING) or wait PENDING, costing the backend nothing
STUCK = {"stuck_export": synthetic_type("orders", 1000, fault={"delay_sec": 3000})}


STARTUP_SEC = 90.0  # a process's wait to answer /healthz on a loaded machine


@dataclass
class Settings:
    quick: bool
    sizes: tuple[int, ...] = (1, 2, 4, 8)  # the accuracy section's numbers of gateway processes

    def seconds(self, full: float, quick: float) -> float:
        return quick if self.quick else full


def cpu_seconds(pid: int) -> float:
    """user + sys of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_of(service: Service) -> int:
    assert service.proc is not None
    return service.proc.pid


def fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


# -- 1 and 6: per-plugin cost -------------------------------------------------------------------------

# route of the shipped config measured for each chain, and the plugins a leave-one-out does not drop
CHAINS = {"hit": "status", "list": "list", "submit": "submit"}
KEPT = {("hit", "status_cache"): "it is what makes the request a cache hit (its cost: section 6)"}
SUBMIT_LUA = """
wrk.method = "POST"
wrk.body = '{"export_type": "stuck_export"}'
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  wrk.headers["Idempotency-Key"] = "%(tag)s-" .. n
  return wrk.format()
end
"""


def plugin_name(entry: Any) -> str:
    return entry if isinstance(entry, str) else str(next(iter(entry)))


@dataclass(frozen=True)
class Variant:
    chain: str
    label: str  # "full A", "full B", "without auth", ...
    dropped: frozenset[str]
    prefix: str  # the variant's route lives under /<prefix>


@dataclass
class Run:
    variant: Variant
    cpu_us: float
    rps: float
    p99_ms: float
    requests: int
    errors: int


def variant_route(route: dict[str, Any], variant: Variant) -> dict[str, Any]:
    copied = copy.deepcopy(route)
    copied["name"] = f"{route['name']}-{variant.prefix}"
    copied["path"] = f"/{variant.prefix}{route['path']}"
    copied["plugins"] = [p for p in route["plugins"] if plugin_name(p) not in variant.dropped]
    return copied


def refusal(config: dict[str, Any]) -> str | None:
    """Why the gateway would refuse this config (the first problem), or None."""
    try:
        validate_data(interpolate(config, "", []), GatewayConfig, "variant")
    except ConfigError as exc:
        return exc.problems[0]
    return None


def variants(base: dict[str, Any], chains: list[str], drops: dict[str, list[frozenset[str]]] | None
             ) -> tuple[list[Variant], list[tuple[str, str, str]]]:
    """Full A, each leave-one-out the config accepts (or `drops`), full B; and (chain, plugin, why) of those left."""
    routes = {r["name"]: r for r in base["routes"]}
    counter = itertools.count()
    chosen: list[Variant] = []
    skipped: list[tuple[str, str, str]] = []
    for chain in chains:
        route = routes[CHAINS[chain]]
        names = [plugin_name(p) for p in route["plugins"]]
        wanted = drops[chain] if drops is not None else [frozenset({n}) for n in names]
        middle = []
        for dropped in wanted:
            label = "without " + " and ".join(sorted(dropped))
            kept_why = next((KEPT[(chain, n)] for n in dropped if (chain, n) in KEPT and drops is None), None)
            variant = Variant(chain, label, dropped, f"v{next(counter)}")
            problem = refusal({**base, "routes": [*base["routes"], variant_route(route, variant)]})
            # a config problem reads "routes[i].plugins[j].name: route `x`: what and why"
            why = kept_why or (problem.split(": ", 2)[-1] if problem else None)
            if why:
                skipped.append((chain, " and ".join(sorted(dropped)), why))
            else:
                middle.append(variant)
        # the two identical full chains open and close the chain's runs: their difference is the run's noise
        chosen += [Variant(chain, "full A", frozenset(), f"v{next(counter)}"), *middle,
                   Variant(chain, "full B", frozenset(), f"v{next(counter)}")]
    return chosen, skipped


# the load each chain is measured at: the same for every variant (CPU per request depends on how many requests
# a process takes per wake-up, so a faster variant run flat out would look cheaper), below what the full chain
# serves on this loaded machine
RATES = {"hit": 1500.0, "list": 400.0, "submit": 25.0}


def probe(url: str, chain: str) -> int:
    """The status one request of the variant gets (a variant the route cannot serve is not measured)."""
    if chain == "submit":
        return httpx.post(url, json={"export_type": "stuck_export"}, timeout=30,
                          headers={**AUTH, "Idempotency-Key": uuid.uuid4().hex}).status_code
    return httpx.get(url, headers=AUTH, timeout=30).status_code


def measure_chains(s: Settings, chains: list[str], drops: dict[str, list[frozenset[str]]] | None
                   ) -> tuple[list[Run], list[tuple[str, str, str]]]:
    seconds = s.seconds(10, 2)
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning",
                                                             export_types=STUCK), "backend", timeout=STARTUP_SEC)
        base = gateway_config(procs.workdir, backend.url, log_level="warning")
        chosen, skipped = variants(base, chains, drops)
        routes = {r["name"]: r for r in base["routes"]}
        base["routes"] += [variant_route(routes[CHAINS[v.chain]], v) for v in chosen]
        gateway = procs.start("gateway", base, "gateway", timeout=STARTUP_SEC)
        done = submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"})
        runs = []
        for v in chosen:
            if v.chain == "hit":
                url, lua = f"{gateway.url}/{v.prefix}{API}/{done}", ""
            elif v.chain == "list":
                url, lua = f"{gateway.url}/{v.prefix}{API}?limit=1", ""
            else:
                url, lua = f"{gateway.url}/{v.prefix}{API}", SUBMIT_LUA % {"tag": uuid.uuid4().hex}
            status = probe(url, v.chain)
            if status >= 300:
                skipped.append((v.chain, " and ".join(sorted(v.dropped)), f"the route answers {status} without it"))
                continue
            rate = RATES[v.chain]
            paced(url, rate, 1, 32, lua)  # warm-up: pools, caches, the route's first call
            before = cpu_seconds(pid_of(gateway))
            result, counts = paced(url, rate, seconds, 32, lua)
            used = cpu_seconds(pid_of(gateway)) - before
            runs.append(Run(v, used / max(1, result.requests) * 1e6, result.rps, result.p99_ms, result.requests,
                            result.errors + counts.refused + counts.other))
            print(f"  {v.chain:6} {v.label:38} {runs[-1].cpu_us:7.0f} us/request  {result.line()}", flush=True)
    return runs, skipped


def chain_table(runs: list[Run], chain: str) -> list[str]:
    mine = [r for r in runs if r.variant.chain == chain]
    full = [r for r in mine if r.variant.label.startswith("full")]
    cpu_full = statistics.mean(r.cpu_us for r in full)
    p99_full = statistics.mean(r.p99_ms for r in full)
    cpu_noise = abs(full[0].cpu_us - full[-1].cpu_us)
    p99_noise = abs(full[0].p99_ms - full[-1].p99_ms)
    rows = [f"| {r.variant.label} | {fmt(r.cpu_us)} | {fmt(r.rps)} | {r.p99_ms:.1f} | {r.requests:,} | — | — |"
            for r in full]
    for r in mine:
        if r in full:
            continue
        cost = cpu_full - r.cpu_us
        share = cost / cpu_full
        p99 = p99_full - r.p99_ms
        p99_text = f"{p99:+.1f} ms" if abs(p99) > p99_noise else f"within noise (±{p99_noise:.1f} ms)"
        note = "" if abs(cost) > cpu_noise else " (within noise)"
        errors = f", {r.errors:,} errors" if r.errors else ""
        rows.append(f"| {r.variant.label} | {fmt(r.cpu_us)} | {fmt(r.rps)} | {r.p99_ms:.1f} | "
                    f"{r.requests:,}{errors} | **{cost:+.0f} µs ({share:+.0%})**{note} | {p99_text} |")
    return [f"Noise of this run: full A vs full B differ by {cpu_noise:.0f} µs CPU per request and "
            f"{p99_noise:.1f} ms p99.", "",
            "| chain | gateway CPU µs / request | req/s | p99 ms | requests | the plugin's CPU (full minus without) "
            "| p99 the plugin adds |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def plugin_cost(s: Settings) -> str:
    runs, skipped = measure_chains(s, list(CHAINS), None)
    titles = {"hit": "Cache-hit status poll (`GET /api/v1/exports/{id}`, route `status`)",
              "list": "List (`GET /api/v1/exports?limit=1`, route `list`; every call proxied)",
              "submit": "Submit (`POST /api/v1/exports`, route `submit`; a new `Idempotency-Key` each)"}
    out = []
    for chain, title in titles.items():
        out += [f"**{title}** — measured", "", *chain_table(runs, chain)]
    if skipped:
        out += ["Not left out (the rest of the chain cannot run without them, as the gateway's config check "
                "says, or the figure would change meaning):", ""]
        out += [f"- {chain}: `{plugin}` — {why}" for chain, plugin, why in skipped]
        out.append("")
    return "\n".join(out)


def guarantee_costs(s: Settings) -> str:
    both = frozenset({"idempotency", "outbox"})
    runs, _ = measure_chains(s, ["submit", "hit"], {"submit": [frozenset({"idempotency"}), frozenset({"outbox"}), both],
                                                    "hit": [frozenset({"status_cache"})]})
    rows = []
    for chain, dropped, what in (("submit", frozenset({"idempotency"}), "idempotency (a submit)"),
                                 ("submit", frozenset({"outbox"}), "the outbox (a submit)"),
                                 ("submit", both, "idempotency and the outbox (a submit)"),
                                 ("hit", frozenset({"status_cache"}), "the status cache (a poll of a finished task; "
                                                                      "without it every poll is proxied)")):
        full = [r for r in runs if r.variant.chain == chain and r.variant.label.startswith("full")]
        cpu_full = statistics.mean(r.cpu_us for r in full)
        noise = abs(full[0].cpu_us - full[-1].cpu_us)
        r = next(r for r in runs if r.variant.chain == chain and r.variant.dropped == dropped)
        rows.append(f"| {what} | {fmt(cpu_full)} | {fmt(r.cpu_us)} | **{cpu_full / r.cpu_us:.2f}x** | "
                    f"{noise:.0f} µs | measured |")
    return "\n".join(["| guarantee | gateway CPU µs / request with it | without it | with / without "
                      "| noise (full A vs B) | source |", "|---|---|---|---|---|---|", *rows, ""])


# -- 2: rate-limit accuracy ---------------------------------------------------------------------------

# a burst of one second's worth: a gateway process the loaded machine leaves unscheduled for a moment
# loses no tokens on its return (a bucket holds at most the burst), so allowed stays what could be admitted
LIMIT_PER_SEC, LIMIT_BURST = 1000, 1000
# One wrk thread paced to `rate` requests a second: the gap between a connection's requests is corrected
# once a second by what was sent in the last one (wrk has no pacing of its own). 200, 429 and the rest are
# counted apart and printed at the end.
PACED_LUA = """
local target, gap = %(rate)f, %(gap)f
local second, sent, seconds = 0, 0, 0
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok, refused, other = 0, 0, 0 end
function delay()
  local now = os.time()
  if now ~= second then
    -- the first second seen is a part of one: its count says nothing of the rate
    if seconds >= 2 then gap = gap * math.min(2, math.max(0.5, sent / target)) end
    second, sent, seconds = now, 0, seconds + 1
  end
  sent = sent + 1
  return math.floor(gap * (0.5 + math.random()))
end
function response(status, headers, body)
  if status == 200 or status == 202 then ok = ok + 1
  elseif status == 429 then refused = refused + 1
  else other = other + 1 end
end
function done(summary, latency, requests)
  local o, r, x = 0, 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); r = r + t:get("refused"); x = x + t:get("other") end
  io.write(string.format("STATUS ok=%%d refused=%%d other=%%d\\n", o, r, x))
end
"""


@dataclass
class Paced:
    ok: int
    refused: int
    other: int

    @property
    def sent(self) -> int:
        return self.ok + self.refused + self.other


def paced(url: str, rate: float, seconds: float, connections: int, prelude: str = "") -> tuple[wrk.WrkResult, Paced]:
    """wrk offering `rate` requests a second; `prelude`: Lua run first (a method, a body, a `request`)."""
    lua = prelude + PACED_LUA % {"rate": rate, "gap": connections * 1000 / rate}
    result, out = wrk.run_with_output(url, seconds=seconds, connections=connections, headers=AUTH, lua=lua)
    found = re.search(r"STATUS ok=(\d+) refused=(\d+) other=(\d+)", out)
    if found is None:
        raise RuntimeError(f"wrk printed no status counts:\n{out}")
    return result, Paced(*(int(x) for x in found.groups()))


def offered_split(n: int) -> list[float]:
    """2x the limit, 70 % of it on the first process and the rest spread over the others."""
    total = 2 * LIMIT_PER_SEC
    return [float(total)] if n == 1 else [0.7 * total] + [0.3 * total / (n - 1)] * (n - 1)


def limited_gateways(procs: Processes, backend: Service, redis_url: str, n: int, declared: int, tag: str
                     ) -> list[Service]:
    env = {"TENANT_REQUESTS_PER_SEC": str(LIMIT_PER_SEC), "TENANT_REQUESTS_BURST": str(LIMIT_BURST)}

    def start(i: int) -> Service:
        workdir = procs.workdir / f"{tag}-{i}"
        # 429s answered at once: held ones (refusal_hold) would slow the paced load, not change what is admitted
        config = gateway_config(workdir, backend.url, redis_url, log_level="warning", gateway_processes=declared,
                                refusal_hold={"after_per_sec": 1_000_000})
        return procs.start("gateway", config, f"{tag}-{i}", env=env, timeout=STARTUP_SEC)

    with ThreadPoolExecutor(n) as pool:  # started together: one by one, eight take a while on a loaded machine
        return list(pool.map(start, range(n)))


_ANSWERED = re.compile(r'^gateway_requests_total\{([^}]*)\} ([\d.e+]+)$', re.MULTILINE)
# a task id the status route's task_id check refuses (4xx) right after the limiter: an admitted request then
# costs neither Redis nor the backend anything more, so the figure is the limiter's alone
UNKNOWN_TASK = "not-a-task-id"


def admitted_so_far(gateway: Service) -> int:
    """Status-route requests the gateway has answered with anything but 429, from its own metrics (a client's
    count would miss an answer still on its way when the load generator stopped)."""
    total = 0
    for labels, value in _ANSWERED.findall(httpx.get(f"{gateway.url}/metrics", timeout=30).text):
        if 'route="status"' in labels and 'status="429"' not in labels:
            total += int(float(value))
    return total


def redis_ms(redis: RedisServer) -> float:
    seconds, micros = redis.client().time()
    return float(seconds * 1000 + micros / 1000)


def unused_tokens(redis: RedisServer) -> tuple[float, float]:
    """What the shared bucket of the benchmark's tenant holds now (GCRA: burst - (TAT - now) / interval), and
    now on the Redis clock (ms)."""
    stored = redis.client().get("gw:rl:{demo}:requests")
    now_ms = redis_ms(redis)
    if stored is None:
        return float(LIMIT_BURST), now_ms
    return max(0.0, LIMIT_BURST - (float(stored) - now_ms) * LIMIT_PER_SEC / 1000), now_ms


def storm_limits(gateways: list[Service], task_id: str, seconds: float, redis: RedisServer | None = None
                 ) -> tuple[list[Admitted], float, float]:
    """Paced load on each gateway at once; `ok` is what each gateway admitted (its metrics). With `redis`, also
    what the shared bucket held unused when the load stopped, and the seconds from the bucket's reset to then
    (the wrk runs start and end a little apart); without, `seconds`."""
    rates = offered_split(len(gateways))
    before = [admitted_so_far(g) for g in gateways]
    started = 0.0
    if redis is not None:
        # a full bucket the moment the load starts: tokens a full bucket gains meanwhile are not kept
        redis.client().flushall()
        started = redis_ms(redis)
    with ThreadPoolExecutor(len(gateways)) as pool:
        futures = [pool.submit(paced, f"{g.url}{API}/{task_id}", rate, seconds, 256 if rate > 500 else 32)
                   for g, rate in zip(gateways, rates, strict=True)]
        counts = [f.result()[1] for f in futures]
    unused, window = 0.0, seconds
    if redis is not None:
        unused, ended = unused_tokens(redis)
        window = (ended - started) / 1000
    time.sleep(1)  # answers still in flight are counted
    # what wrk was answered, and what each gateway's metrics say it admitted (answers wrk still awaited included)
    return [Admitted(c, admitted_so_far(g) - start) for c, g, start in zip(counts, gateways, before, strict=True)], \
        unused, window


@dataclass
class Admitted:
    answered: Paced
    ok: int

    @property
    def sent(self) -> int:
        return self.answered.sent

    @property
    def refused(self) -> int:
        return self.answered.refused


def verdict(ratio: float, offered: float) -> str:
    if abs(ratio - 1) <= 0.02:
        return "met"
    if offered < 1.8 * LIMIT_PER_SEC:
        return f"not measured: this machine offered {offered / LIMIT_PER_SEC:.1f}x the limit, not 2x"
    return "missed"


def accuracy(s: Settings) -> str:
    seconds = s.seconds(60, 5)
    down_seconds = s.seconds(15, 5)
    rows, down_rows = [], []
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning"), "backend",
                timeout=STARTUP_SEC)
        redis = RedisServer(procs.workdir).start()
        try:
            for n in s.sizes:
                gateways = limited_gateways(procs, backend, redis.url, n, n, f"acc{n}")
                counts, unused, window = storm_limits(gateways, UNKNOWN_TASK, seconds, redis)
                for g in gateways:
                    g.stop()
                allowed = LIMIT_BURST + LIMIT_PER_SEC * window
                admitted = sum(c.ok for c in counts)
                offered = sum(c.sent for c in counts) / seconds
                ratio = admitted / allowed
                per = " / ".join(f"{c.ok:,}" for c in counts)
                refused = sum(c.refused for c in counts)
                rows.append(f"| {n} | {offered:,.0f}/s ({offered / LIMIT_PER_SEC:.1f}x) | {per} | {admitted:,} | "
                            f"{refused:,} | {allowed:,.0f} | **{ratio:.4f}** ({ratio - 1:+.2%}) | {unused:,.0f} | "
                            f"{(admitted + unused) / allowed:.4f} | {verdict(ratio, offered)} | measured |")
                print(f"  {n} processes: admitted {admitted} of {allowed:.0f} allowed ({ratio:.4f}), {per}; "
                      f"offered {offered:.0f}/s; {unused:.0f} unused in the bucket at the end", flush=True)
            redis.stop()
            share = LIMIT_BURST / 2 + LIMIT_PER_SEC / 2 * down_seconds
            total_allowed = LIMIT_BURST + LIMIT_PER_SEC * down_seconds
            for declared in (2, 1):
                gateways = limited_gateways(procs, backend, redis.url, 2, declared, f"down{declared}")
                for g in gateways:  # each learns that Redis is gone; its local share starts full
                    httpx.get(f"{g.url}{API}/{UNKNOWN_TASK}", headers=AUTH, timeout=10)
                counts, _, _ = storm_limits(gateways, UNKNOWN_TASK, down_seconds)
                for g in gateways:
                    g.stop()
                admitted = sum(c.ok for c in counts)
                per = " / ".join(f"{c.ok:,} ({c.ok / share:.2f})" for c in counts)
                word = "right" if declared == 2 else "wrong: 1"
                down_rows.append(f"| 2 | {declared} ({word}) | {per} | {admitted:,} | {total_allowed:,.0f} | "
                                 f"**{admitted / total_allowed:.3f}** | measured |")
                print(f"  Redis down, gateway_processes={declared}: {per}, total {admitted}", flush=True)
        finally:
            redis.stop()
    return "\n".join([
        f"Limit {LIMIT_PER_SEC:,}/s with a burst of {LIMIT_BURST:,} (one second's worth: a process the loaded "
        "machine leaves unscheduled for a moment loses no tokens), on one private redis-server; offered 2x the limit "
        f"for {seconds:.0f} s, 70 % of it on the first gateway process and the rest spread over the others (one "
        "paced wrk per process; the offered column is what wrk managed to send). The requests name a task id the "
        "route's `task_id` check refuses right after the limiter, so an admitted request costs nothing more and "
        "the figure is the limiter's. Allowed = burst + rate x duration; admitted = every answer but 429, counted "
        "by each gateway's metrics; the duration runs from the bucket's reset, as the load starts, to the end of the "
        "last wrk (on the Redis clock).", "",
        "| gateway processes | offered | admitted per process | admitted | refused (429) | allowed "
        "| admitted / allowed | unused in the bucket at the end | (admitted + unused) / allowed | goal 1 ± 2 % "
        "| source |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "A token the limiter did not hand out is either still in the bucket when the load stops (counted above: "
        "the load fell below the limit for a while, and the bucket refilled) or was lost to a full bucket (the "
        "load stayed below the limit for longer than the burst lasts). (admitted + unused) / allowed above 1 would "
        "be the limiter admitting too much; below 1, tokens lost to a full bucket.", "",
        f"**Redis down** ({down_seconds:.0f} s, the same offered split over 2 processes): each process keeps "
        "limit / `gateway_processes` on its own. Per process: admitted, and in brackets over its fair share (half "
        "the limit and half the burst); total over the whole limit.", "",
        "| processes | `gateway_processes` | admitted per process (÷ half the limit) | total | allowed (whole limit) "
        "| total / allowed | source |",
        "|---|---|---|---|---|---|---|", *down_rows, ""])


# -- 3: coalescing ------------------------------------------------------------------------------------

TTL_SEC = 5  # the shipped status_cache ttl_sec


def storm_requests(gateways: list[Service], ids: list[str], seconds: float, connections: int = 1000) -> int:
    lua = "ids = {" + ",".join(f'"{i}"' for i in ids) + "}\n" + \
          f'request = function() return wrk.format("GET", "{API}/" .. ids[math.random(1, #ids)]) end\n'
    with ThreadPoolExecutor(len(gateways)) as pool:
        futures = [pool.submit(wrk.run, g.url, seconds, connections // len(gateways), 1, AUTH, lua)
                   for g in gateways]
        return sum(f.result().requests for f in futures)


def coalescing(s: Settings) -> str:
    seconds = s.seconds(15, 4)
    rows = []
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning", workers=10,
                                                             export_types=STUCK), "backend", timeout=STARTUP_SEC)
        redis = RedisServer(procs.workdir).start()
        try:
            setups: dict[str, list[Service]] = {}

            def gateways(kind: str) -> list[Service]:
                if kind not in setups:
                    n, shared = (1, "") if kind == "1" else (2, "" if kind == "2 embedded" else redis.url)
                    setups[kind] = [procs.start("gateway", gateway_config(
                        procs.workdir / f"co-{kind}-{i}".replace(" ", "-"), backend.url, shared, log_level="warning",
                        gateway_processes=n, connection_limits={"max_connections": 2048}), f"co{len(setups)}-{i}",
                                timeout=STARTUP_SEC)
                        for i in range(n)]
                return setups[kind]

            first = gateways("1")[0]
            finished = [submit_and_wait(first.url, {"export_type": "report_export"}, {"COMPLETED"}) for _ in range(20)]
            running = [submit_and_wait(first.url, {"export_type": "stuck_export", "timeout_sec": 3600}, {"RUNNING"})
                       for _ in range(8)]
            cases = [("finished", "1", "1 process (cache in memory)", "≤ 1.0"),
                     ("finished", "2 embedded", "2 processes, each its own cache in memory", "≤ 1.0 per process"),
                     ("finished", "2 redis", "2 processes, one Redis cache", "≤ 1.0 in total"),
                     ("running", "1", "1 process", "reported"), ("running", "2 redis", "2 processes on one Redis",
                                                                 "reported")]
            for tasks, kind, label, goal in cases:
                ids = finished if tasks == "finished" else running
                gws = gateways(kind)
                time.sleep(TTL_SEC + 0.5)  # nothing cached from the run before
                if tasks == "finished":
                    served, counted = counted_storm(backend, gws, ids, seconds)
                    calls = counted.calls
                    print(f"  calls per TTL window: {counted.per_window}", flush=True)
                    rows.append(finished_row(label, goal, len(ids), len(gws) if kind == "2 embedded" else 1, served,
                                             counted))
                else:
                    before = backend_requests(backend.url)
                    served = storm_requests(gws, ids, seconds)
                    calls = backend_requests(backend.url) - before
                    rows.append(f"| {tasks} ({len(ids)} tasks) | {label} | {served:,} | {calls:,} | "
                                f"**{calls / len(ids) / seconds:.2f}** per task per second | {goal} | measured |")
                print(f"  {tasks} {label}: {served} polls, {calls} upstream calls", flush=True)
        finally:
            redis.stop()
    return "\n".join([
        f"1,000 polling connections (wrk, split evenly over the processes) for {seconds:.0f} s, each poll of a "
        "random task of the set; upstream calls counted by the backend. A finished task's answer is cached for "
        f"the TTL ({TTL_SEC} s); a RUNNING task's is not cached, and concurrent polls of it share one upstream call.",
        "", "Finished tasks are counted per TTL window, aligned to the first fill: the benchmark reads the "
        "backend's call count every 10 ms during the storm; its first rise (t0) is the first fill, and window j "
        "is [t0 + j·TTL, t0 + (j + 1)·TTL). An entry lives a whole TTL from its fill and no process fills before "
        "t0, so a task's j-th refill in a process comes at or after t0 + j·TTL, never in an earlier window; under "
        "a storm it comes right then, late only by the first fills' spread and each fill's latency (milliseconds "
        "on a quiet machine). While that lateness adds up to less than a TTL, a cache that makes one call per "
        "task per window puts exactly one in each window and reads **1.00** per process, whatever the storm's "
        "edges. The windows counted are those whose middle the polling reached (3 in a 15 s storm whose first "
        "fill comes in its first 2.5 s); each window's calls are given, so fills pushed out of their window "
        "would show as an uneven split.",
        "", "| tasks | gateways | polls answered | upstream calls | upstream calls | goal | source |",
        "|---|---|---|---|---|---|---|", *rows, ""])


def counted_storm(backend: Service, gateways: list[Service], ids: list[str], seconds: float) -> tuple[int, Windows]:
    """The storm on finished tasks: polls answered, and the upstream calls counted over whole TTL windows."""
    sampler = CallSampler(backend.url, seconds + 60)
    before = sampler.start()
    launched = time.monotonic()  # wrk polls for `seconds` at least from its launch, after this
    served = storm_requests(gateways, ids, seconds)
    # the last window counted ends at most half a TTL after the polling
    return served, windowed(sampler.stop(launched + seconds + TTL_SEC / 2), before, launched + seconds, TTL_SEC)


def finished_row(label: str, goal: str, tasks: int, caches: int, served: int, counted: Windows) -> str:
    """`caches`: the processes that each fill on their own (2 with a cache in memory each, else 1)."""
    head = f"| finished ({tasks} tasks) | {label} | {served:,} |"
    if not counted.windows:
        return f"{head} - | **not measured**: no whole TTL window after the first fill | {goal} | - |"
    per = counted.per_task(tasks)
    figure = (f"**{per / caches:.2f}** per task per {TTL_SEC} s TTL per process ({per:.2f} in total)" if caches > 1
              else f"**{per:.2f}** per task per {TTL_SEC} s TTL")
    split = " / ".join(f"{n:,}" for n in counted.per_window)
    return f"{head} {counted.calls:,} in {counted.windows} TTL windows ({split}) | {figure} | {goal} | measured |"


# -- 4: degradation -----------------------------------------------------------------------------------

async def outage_load(gateway: str, known: list[str], seconds: float) -> dict[str, Any]:
    counts = {"polls": 0, "answered": 0, "submits": 0, "accepted": 0}
    accepted: list[str] = []
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(headers=AUTH, timeout=20) as client:
        async def worker(w: int) -> None:
            rng = random.Random(w)
            for i in itertools.count():
                if time.monotonic() > deadline:
                    return
                counts["polls"] += 1
                resp = await client.get(f"{gateway}{API}/{rng.choice(known)}")
                counts["answered"] += resp.status_code == 200
                if i % 3 == 0:
                    counts["submits"] += 1
                    resp = await client.post(f"{gateway}{API}", json={"export_type": "report_export"},
                                             headers={"Idempotency-Key": uuid.uuid4().hex})
                    if resp.status_code in (200, 201, 202):
                        counts["accepted"] += 1
                        accepted.append(resp.json()["data"]["task_id"])
                await asyncio.sleep(0.05)

        await asyncio.gather(*(worker(w) for w in range(4)))
    return {**counts, "ids": accepted}


def degradation(s: Settings) -> str:
    outage = s.seconds(30, 8)
    with processes() as procs:
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning", workers=4),
                              "backend", timeout=STARTUP_SEC)
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url, log_level="warning"), "gateway",
                timeout=STARTUP_SEC)
        known = [submit_and_wait(gateway.url, {"export_type": "report_export"}, {"COMPLETED"}) for _ in range(10)]
        for task_id in known:
            httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH)
        backend.kill()
        result = asyncio.run(outage_load(gateway.url, known, outage))
        backend.start()
        found: set[str] = set()

        def delivered() -> bool:
            for task_id in result["ids"]:
                if task_id not in found and httpx.get(f"{backend.url}/exports/{task_id}",
                                                      headers=backend_headers("demo")).status_code == 200:
                    found.add(task_id)
            return len(found) == len(result["ids"])

        with contextlib.suppress(AssertionError):
            wait_until(delivered, 120, interval=1, what="the outbox to deliver every accepted submit")
    lost = len(result["ids"]) - len(found)
    print(f"  outage: {result['answered']}/{result['polls']} polls answered, {result['accepted']}/{result['submits']} "
          f"submits accepted, {lost} lost", flush=True)
    return "\n".join([
        f"One gateway (embedded state, the shipped chains) and one backend, killed (SIGKILL) for {outage:.0f} s and "
        "started again on the same port and store. During the outage four clients poll ten finished tasks "
        "(each polled once before) and submit (a new `Idempotency-Key` each, one submit per three polls). After "
        "it, each accepted submit's task id is looked up in the backend (up to 120 s for the outbox to deliver).",
        "", "| figure | count | goal | source |", "|---|---|---|---|",
        f"| polls answered 200 during the outage | {result['answered']:,} of {result['polls']:,} "
        f"(**{result['answered'] / max(1, result['polls']):.1%}**) | all | measured |",
        f"| submits accepted (202, held in the outbox) | {result['accepted']:,} of {result['submits']:,} "
        f"(**{result['accepted'] / max(1, result['submits']):.1%}**) | all | measured |",
        f"| accepted submits missing from the backend after it | **{lost}** | 0 | measured |", ""])


# -- 5: push vs poll ----------------------------------------------------------------------------------

def follow(gateway: str, backend: Service, streams: bool, tasks: int) -> tuple[int, float]:
    ids = []
    for _ in range(tasks):
        resp = httpx.post(f"{gateway}{API}", json={"export_type": "watched_export"}, headers=AUTH, timeout=30)
        ids.append(resp.json()["data"]["task_id"])
    before = backend_requests(backend.url)
    started = time.monotonic()

    def wait(task_id: str) -> str:
        with ExportsClient(gateway, DEMO_KEY, streams=streams) as client:
            return client.wait(task_id, max_wait=300).status

    with ThreadPoolExecutor(tasks) as pool:
        statuses = list(pool.map(wait, ids))
    assert all(status == "COMPLETED" for status in statuses), statuses
    return backend_requests(backend.url) - before, time.monotonic() - started


def push_vs_poll(s: Settings) -> str:
    tasks, task_sec = 10, s.seconds(20, 4)
    with processes() as procs:
        types = {"watched_export": synthetic_type("orders", 1000, 2, fault={"delay_sec": task_sec})}
        backend = procs.start("backend_stub", backend_config(procs.workdir, log_level="warning", workers=tasks,
                                                             export_types=types), "backend", timeout=STARTUP_SEC)
        gateway = procs.start("gateway", gateway_config(procs.workdir, backend.url, log_level="warning"), "gateway",
                timeout=STARTUP_SEC)
        streamed, streamed_sec = follow(gateway.url, backend, True, tasks)
        polled, polled_sec = follow(gateway.url, backend, False, tasks)
    print(f"  push {streamed} vs poll {polled} backend requests for {tasks} tasks", flush=True)
    return "\n".join([
        f"{tasks} tasks of {task_sec:.0f} s each, each followed to COMPLETED by one SDK client "
        "(`ExportsClient.wait`): on its event stream (the backend's change feed behind it), then, for another "
        f"{tasks} tasks, polling (`streams=False`: the SDK's backoff under the gateway's `Retry-After`). Backend "
        "requests counted by the backend from the first wait to the last answer.", "",
        "| client | backend requests | per task followed | wall time | source |", "|---|---|---|---|---|",
        f"| event stream | {streamed} | **{streamed / tasks:.1f}** | {streamed_sec:.1f} s | measured |",
        f"| SDK polling | {polled} | **{polled / tasks:.1f}** | {polled_sec:.1f} s | measured |",
        f"| polling / streaming | | **{polled / max(1, streamed):.1f}x** | | measured |", ""])


@contextlib.contextmanager
def section(title: str) -> Iterator[None]:
    print(f"== {title}", flush=True)
    started = time.monotonic()
    yield
    print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
