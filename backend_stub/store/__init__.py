"""Task state and the work queue, behind one interface with two implementations."""
from __future__ import annotations

from backend_stub.config import BackendConfig
from backend_stub.store.base import Change, Lease, TaskStore
from backend_stub.store.fair import Fairness


def open_store(config: BackendConfig) -> TaskStore:
    fairness = Fairness(config.scheduler)
    if config.redis_url:
        from backend_stub.store.redis_store import RedisTaskStore

        return RedisTaskStore(config.redis_url, config.redis_prefix, fairness)
    from backend_stub.store.sqlite_store import SqliteTaskStore

    return SqliteTaskStore(config.data_dir, fairness)


__all__ = ["Change", "Lease", "TaskStore", "open_store"]
