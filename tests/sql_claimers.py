"""Claimers in a process of their own, on the SQL task store: `python -m tests.sql_claimers URL CLAIMERS CLAIMS OUT`.

Each of CLAIMERS coroutines claims, holds the lease a moment and acks, until the process has made
CLAIMS claims; every claimed task id is written to OUT, one a line. The scheduler settings are the
JSON in the SCHEDULER variable.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

from backend_stub.config import SchedulerConfig
from backend_stub.store.fair import Fairness
from backend_stub.store.sql_store import SqlTaskStore
from exports_common.sql import EngineSettings

HOLD_SEC = 0.002


async def main(url: str, claimers: int, claims: int, out: str) -> None:
    fairness = Fairness(SchedulerConfig(**json.loads(os.environ.get("SCHEDULER", "{}"))))
    store = SqlTaskStore(url, fairness, settings=EngineSettings(pool_size=claimers))
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
    with open(out, "w") as file:
        file.write("\n".join(claimed) + "\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
