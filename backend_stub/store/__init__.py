"""Task state, the work queue, the change log and callback claims, behind one interface with two implementations."""
from __future__ import annotations

import sqlite3

from redis.exceptions import RedisError

from backend_stub.config import BackendConfig
from backend_stub.store.base import Change, ChangeEntry, ChangeLogGap, DeliveryClaim, Lease, TaskStore
from backend_stub.store.fair import Fairness
from exports_common.sql import EngineSettings, SqlError


def store_down(waiting: str) -> dict[type[Exception], str]:
    """A background loop's expected store failures, each with what waits and what to check."""
    return {
        RedisError: f"the task store (Redis) does not answer; {waiting} until it does: check that Redis runs "
                    "at redis_url",
        sqlite3.Error: f"the task store (SQLite) failed; {waiting} until it works: check data_dir's disk",
        SqlError: f"the task store (SQL database) does not answer; {waiting} until it does: check that the "
                  "server at database_url runs",
        OSError: f"the task store cannot be reached; {waiting} until it can",
    }


def sql_settings(config: BackendConfig) -> EngineSettings:
    return EngineSettings(pool_size=config.database_pool_size, pool_timeout=config.database_pool_timeout_sec,
                          application_name="exports-backend")


def open_store(config: BackendConfig) -> TaskStore:
    fairness = Fairness(config.scheduler)
    retention = config.change_log.retention_sec
    kind = config.store_kind()
    if kind == "sql":
        from backend_stub.store.sql_store import SqlTaskStore

        return SqlTaskStore(config.database_url, fairness, retention, sql_settings(config))
    if kind == "redis":
        from backend_stub.store.redis_store import RedisTaskStore

        return RedisTaskStore(config.redis_url, config.redis_prefix, fairness, retention)
    from backend_stub.store.sqlite_store import SqliteTaskStore

    return SqliteTaskStore(config.data_dir, fairness, retention)


__all__ = ["Change", "ChangeEntry", "ChangeLogGap", "DeliveryClaim", "Lease", "TaskStore", "open_store", "sql_settings",
           "store_down"]
