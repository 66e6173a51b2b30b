"""Task state and the work queue, behind one interface with two implementations."""
from __future__ import annotations

from backend_stub.config import BackendConfig
from backend_stub.store.base import Change, Lease, TaskStore


def open_store(config: BackendConfig) -> TaskStore:
    if config.redis_url:
        from backend_stub.store.redis_store import RedisTaskStore

        return RedisTaskStore(config.redis_url, config.redis_prefix)
    from backend_stub.store.sqlite_store import SqliteTaskStore

    return SqliteTaskStore(config.data_dir)


__all__ = ["Change", "Lease", "TaskStore", "open_store"]
