"""Which asyncio driver the SQL task store uses on MariaDB/MySQL: aiomysql or asyncmy, side by side.

Each round runs, through a SQLAlchemy async engine, the store's statement shapes: a transaction with
a locking read and an update (commit-bound: the server's log flush dominates it), and reads of a page
of task rows (driver-bound: decoding). Rounds alternate the drivers so machine load hits both alike;
CPU time of this process is reported next to wall time, since on a loaded machine it is the steadier
figure of what the driver costs.

    .venv/bin/python benchmarks/mysql_async_drivers.py [mysql://root@127.0.0.1:3306/test]
"""
from __future__ import annotations

import asyncio
import statistics
import sys
import time

import sqlalchemy as sa

from exports_common.sql import AsyncMysqlDriver, make_async_engine

ROUNDS = 5
TRANSACTIONS = 100
READS = 300
PAGE = 50


async def one_round(url: str, driver: AsyncMysqlDriver) -> tuple[float, float, float]:
    """(wall us per transaction, wall us per page read, CPU us per page read)."""
    engine = make_async_engine(url, mysql_driver=driver)
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE bench_driver (id INT PRIMARY KEY, n BIGINT, body TEXT)"))
        await conn.execute(sa.text("INSERT INTO bench_driver VALUES (:id, 0, :body)"),
                           [{"id": i, "body": "x" * 600} for i in range(PAGE)])
    try:
        started = time.perf_counter()
        for _ in range(TRANSACTIONS):
            async with engine.begin() as conn:
                await conn.execute(sa.text("SELECT n FROM bench_driver WHERE id = 1 FOR UPDATE"))
                await conn.execute(sa.text("UPDATE bench_driver SET n = n + 1 WHERE id = 1"))
        transaction = (time.perf_counter() - started) / TRANSACTIONS * 1e6
        async with engine.connect() as conn:
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(READS):
                (await conn.execute(sa.text("SELECT id, n, body FROM bench_driver"))).all()
            read = (time.perf_counter() - started) / READS * 1e6
            read_cpu = (time.process_time() - cpu) / READS * 1e6
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE bench_driver"))
        await engine.dispose()
    return transaction, read, read_cpu


async def main(url: str) -> None:
    drivers: tuple[AsyncMysqlDriver, ...] = ("aiomysql", "asyncmy")
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in drivers}
    for _ in range(ROUNDS):
        for driver in drivers:
            results[driver].append(await one_round(url, driver))
    medians = {name: [statistics.median(r[i] for r in rows) for i in range(3)] for name, rows in results.items()}
    for name, (transaction, read, read_cpu) in medians.items():
        print(f"{name}: transaction {transaction:.0f} us wall; page of {PAGE} rows {read:.0f} us wall, "
              f"{read_cpu:.0f} us CPU (medians of {ROUNDS} rounds)")
    ratios = [medians["asyncmy"][i] / medians["aiomysql"][i] for i in range(3)]
    print(f"asyncmy / aiomysql: transaction {ratios[0]:.2f}, page read {ratios[1]:.2f} wall, {ratios[2]:.2f} CPU")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "mysql://root@127.0.0.1:3306/test"))
