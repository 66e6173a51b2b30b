"""Claimers in processes of their own on the SQL task store, and the check the claimers tests make of them.

As a process, `python -m tests.sql_claimers URL CLAIMERS CLAIMS OUT`: each of CLAIMERS coroutines
claims, holds the lease a moment and acks, until the process has made CLAIMS claims; every claimed
task id is written to OUT, one a line, at the end (nothing else per claim). The scheduler settings
are the JSON in the SCHEDULER variable.

`check_claimers` queues the tasks, runs the processes, samples the capped tenant's running tasks
every 10 ms meanwhile, and asserts the cap and the weights.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from backend_stub.config import SchedulerConfig
from backend_stub.models import Task
from backend_stub.store import sql_schema
from backend_stub.store.fair import Fairness
from backend_stub.store.sql_store import SqlTaskStore, check_server
from exports_common import sql
from exports_common.task_ids import new_task_id
from tests.procs import ROOT

HOLD_SEC = 0.002
# the size: 8 claimers in 2 processes, a cap of 2, 2,000 claims
PROCESSES, CLAIMERS_EACH, CLAIMS, CAP = 2, 4, 2000, 2
SCHEDULER = {"weights": {"heavy": 3}, "max_running": {"capped": CAP}}
# more than each tenant is served in CLAIMS claims (3 : 1 : 1 when the cap does not bind), so none runs dry
QUEUED = {"heavy": 1400, "light": 600, "capped": 600}
SAMPLE_SEC = 0.01


async def main(url: str, claimers: int, claims: int, out: str) -> None:
    fairness = Fairness(SchedulerConfig(**json.loads(os.environ.get("SCHEDULER", "{}"))))
    # no ping before each transaction: nothing restarts the server here, and it is a round trip per claim
    store = SqlTaskStore(url, fairness, settings=sql.EngineSettings(pool_size=claimers, pre_ping=False))
    await store.open()
    claimed: list[str] = []

    async def claimer(name: str) -> None:
        while len(claimed) < claims:
            lease = await store.claim(name, 30, 1.0)
            if lease is None:
                continue
            claimed.append(lease.task_id)
            await asyncio.sleep(HOLD_SEC)
            await store.ack(lease)

    await asyncio.gather(*(claimer(f"{os.getpid()}-{n}") for n in range(claimers)))
    await store.close()
    Path(out).write_text("\n".join(claimed) + "\n")


def fill(url: str, counts: dict[str, int]) -> dict[str, str]:
    """Queue that many tasks of each tenant, interleaved, in a few bulk statements (what `create` writes to the
    queue, without its change-log entries: this setup is not what the test measures); task id -> tenant."""
    asyncio.run(check_server(url))  # the schema
    now = time.time()
    tasks = [Task(task_id=new_task_id(), tenant=tenant, export_type="x", filters={}, format="csv", timeout_sec=60,
                  callback_url=None, fingerprint="f", created_at=now, updated_at=now)
             for i in range(max(counts.values())) for tenant, n in counts.items() if i < n]
    engine = sql.make_engine(url)
    with engine.begin() as conn:
        conn.execute(sql_schema.tasks.insert(), [
            {"task_id": t.task_id, "tenant": t.tenant, "status": t.status, "created_at": now, "body": t.to_json()}
            for t in tasks])
        conn.execute(sql_schema.queue.insert(), [{"task_id": t.task_id, "tenant": t.tenant} for t in tasks])
        conn.execute(sql_schema.turns.insert(), [{"tenant": tenant, "turn": 0, "served_at_turn": 0}
                                                 for tenant in counts])
    engine.dispose()
    return {t.task_id: t.tenant for t in tasks}


# generous: on a two-core machine other tests load, the 4,000 commits alone take minutes
TIMEOUT_SEC = 420.0


def check_claimers(url: str, workdir: Path, timeout: float = TIMEOUT_SEC) -> None:
    """The issue's claimers test on the database at `url`: running never above the cap, shares the weights'."""
    owners = fill(url, QUEUED)
    outs = [workdir / f"claimed{n}.txt" for n in range(PROCESSES)]
    env = os.environ | {"SCHEDULER": json.dumps(SCHEDULER)}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.sql_claimers", url, str(CLAIMERS_EACH),
                               str(CLAIMS // PROCESSES), str(out)], cwd=ROOT, env=env) for out in outs]
    queue = sql_schema.queue
    running_query = sa.select(sa.func.count()).select_from(queue).where(
        queue.c.tenant == "capped", queue.c.lease_until.is_not(None))
    engine = sql.make_engine(url, sql.EngineSettings(pool_size=1))
    running = []
    try:
        deadline = time.monotonic() + timeout
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
                running.append(int(conn.execute(running_query).scalar_one()))
                time.sleep(SAMPLE_SEC)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        engine.dispose()
    assert [proc.wait() for proc in procs] == [0] * PROCESSES, f"the claimers ended within {timeout:.0f} s"
    claimed = [line for out in outs for line in out.read_text().split()]
    assert len(claimed) >= CLAIMS and len(set(claimed)) == len(claimed), "no task claimed twice"
    assert max(running) <= CAP, f"the capped tenant ran {max(running)} at once (cap {CAP})"
    assert max(running) == CAP and len(running) > 100, "the cap was reached, sampled often"
    served = Counter(owners[task_id] for task_id in claimed)
    ratio = served["heavy"] / served["light"]
    assert 2.7 <= ratio <= 3.3, f"weight 3 against 1 served {served}: {ratio:.2f}"


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
