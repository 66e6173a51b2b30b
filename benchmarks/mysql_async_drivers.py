"""Which asyncio driver the SQL task store uses on MariaDB/MySQL: aiomysql or asyncmy, side by side.

Each round runs the store's typical transaction shape (a locking read, an update, a commit) through a
SQLAlchemy async engine, alternating the drivers so machine load hits both alike.

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
TRANSACTIONS = 400


async def one_round(url: str, driver: AsyncMysqlDriver) -> float:
    engine = make_async_engine(url, mysql_driver=driver)
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE bench_driver (id INT PRIMARY KEY, n BIGINT)"))
        await conn.execute(sa.text("INSERT INTO bench_driver VALUES (1, 0)"))
    started = time.perf_counter()
    for _ in range(TRANSACTIONS):
        async with engine.begin() as conn:
            await conn.execute(sa.text("SELECT n FROM bench_driver WHERE id = 1 FOR UPDATE"))
            await conn.execute(sa.text("UPDATE bench_driver SET n = n + 1 WHERE id = 1"))
    elapsed = time.perf_counter() - started
    async with engine.begin() as conn:
        await conn.execute(sa.text("DROP TABLE bench_driver"))
    await engine.dispose()
    return elapsed / TRANSACTIONS * 1e6


async def main(url: str) -> None:
    results: dict[str, list[float]] = {"aiomysql": [], "asyncmy": []}
    for _ in range(ROUNDS):
        drivers: tuple[AsyncMysqlDriver, ...] = ("aiomysql", "asyncmy")
        for driver in drivers:
            results[driver].append(await one_round(url, driver))
    for name, costs in results.items():
        print(f"{name}: median {statistics.median(costs):.0f} us per transaction "
              f"({', '.join(f'{cost:.0f}' for cost in costs)})")
    print(f"asyncmy / aiomysql: {statistics.median(results['asyncmy']) / statistics.median(results['aiomysql']):.2f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "mysql://root@127.0.0.1:3306/test"))
