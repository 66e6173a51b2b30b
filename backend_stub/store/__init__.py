"""Task state, the work queue, the change log and callback claims, behind one interface with two implementations."""
from __future__ import annotations

import sqlite3

from redis.exceptions import RedisError

from backend_stub.config import BackendConfig
from backend_stub.store.base import Change, ChangeEntry, ChangeLogGap, DeliveryClaim, Lease, TaskStore
from backend_stub.store.fair import Fairness


def store_down(waiting: str) -> dict[type[Exception], str]:
    """A background loop's expected store failures, each with what waits and what to check."""
    return {
        RedisError: f"the task store (Redis) does not answer; {waiting} until it does: check that Redis runs "
                    "at redis_url",
        sqlite3.Error: f"the task store (SQLite) failed; {waiting} until it works: check data_dir's disk",
        OSError: f"the task store cannot be reached; {waiting} until it can",
    }


def open_store(config: BackendConfig) -> TaskStore:
    fairness = Fairness(config.scheduler)
    retention = config.change_log.retention_sec
    if config.redis_url:
        from backend_stub.store.redis_store import RedisTaskStore

        return RedisTaskStore(config.redis_url, config.redis_prefix, fairness, retention)
    from backend_stub.store.sqlite_store import SqliteTaskStore

    return SqliteTaskStore(config.data_dir, fairness, retention)


__all__ = ["Change", "ChangeEntry", "ChangeLogGap", "DeliveryClaim", "Lease", "TaskStore", "open_store", "store_down"]
