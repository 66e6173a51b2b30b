"""/metrics for every worker of `run --workers N`, whichever worker the scrape reaches.

The gateway counts in plain in-process tallies read by one collector (gateway.telemetry),
not in prometheus_client's metric objects, so prometheus_client's multiprocess mode
(which works on those objects' mmap files) does not apply; this is its equivalent.
Each worker publishes what its registry collects, once a second and atomically, as
`<pid>.json` in $PROMETHEUS_MULTIPROC_DIR (emptied by the supervisor at start). The
worker that is scraped publishes its own afresh and merges every file:
- counters and histograms are summed over every file, a dead worker's included, so
  a total never goes down when a worker is replaced (as in prometheus_client);
- gauges come from live workers only, each merged as `GAUGE_MODES` says.
Other workers' figures are up to PUBLISH_INTERVAL_SEC old.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exports_common import periodic
from exports_common.workers import METRICS_DIR_ENV

log = logging.getLogger("gateway")

PUBLISH_INTERVAL_SEC = 1.0
# sum: a per-worker quantity; own: read from shared state by the scraped worker; max (the rest): the worst
GAUGE_MODES = {"gateway_retries_in_flight": "sum", "gateway_outbox_depth": "own"}

Sample = tuple[str, dict[str, str], float]


def directory() -> Path | None:
    """The run's metrics directory when this process is one of several workers."""
    value = os.environ.get(METRICS_DIR_ENV)
    return Path(value) if value else None


def _snapshot(registry: CollectorRegistry) -> list[list[Any]]:
    return [[m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]]
            for m in registry.collect()]


def publish(registry: CollectorRegistry, where: Path) -> None:
    path = where / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_snapshot(registry)))
    os.replace(tmp, path)  # a reader sees the old file or the new one, never half of one


async def publish_forever(registry: CollectorRegistry, where: Path) -> None:
    async def step() -> None:
        publish(registry, where)

    # a full disk costs the other workers' view of this one's figures, never a request
    await periodic.periodic("worker metrics publishing", step, PUBLISH_INTERVAL_SEC, log,
                            expected={OSError: f"check that {where} is writable and its disk not full"})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Merged(Collector):
    def __init__(self, snapshots: list[tuple[int, list[list[Any]]]]) -> None:
        self.snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[str, str]] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        me = os.getpid()
        for pid, snapshot in self.snapshots:
            live = pid == me or _alive(pid)
            for name, kind, doc, samples in snapshot:
                mode = "sum" if kind != "gauge" else GAUGE_MODES.get(name, "max")
                if kind == "gauge" and (not live or (mode == "own" and pid != me)):
                    continue
                families.setdefault(name, (kind, doc))
                merged = values.setdefault(name, {})
                for sample_name, labels, value in samples:
                    key = (sample_name, tuple(sorted(labels.items())))
                    old = merged.get(key)
                    merged[key] = value if old is None else (old + value if mode == "sum" else max(old, value))
        for name, (kind, doc) in families.items():
            family = Metric(name, doc, kind)
            for (sample_name, labels), value in values[name].items():
                family.add_sample(sample_name, dict(labels), value)
            yield family


def merged_registry(own: CollectorRegistry, where: Path) -> CollectorRegistry:
    """A registry answering for every worker that published into `where`, this one afresh."""
    publish(own, where)
    snapshots = []
    for path in where.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):  # a file of a worker being replaced: skipped this once
            snapshots.append((int(path.stem), json.loads(path.read_text())))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(snapshots))
    return registry
