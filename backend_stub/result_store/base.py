"""The result store's interface: publish a finished file, stream a byte range of it, delete it."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path

from backend_stub.compression import SUFFIXES


class ObjectMissing(Exception):
    """The store answered, and the object is not there."""


class StoreUnavailable(Exception):
    """The store could not be reached or failed; the object may well be there. Worth a retry later."""


def object_key(task_id: str, fmt: str, compression: str | None = None) -> str:
    """The result's name in the store, which is also the name a download is saved under."""
    return f"{task_id}.{fmt}{SUFFIXES[compression] if compression else ''}"


class ResultStore(ABC):
    name: str

    @abstractmethod
    async def publish(self, source: Path, key: str) -> None:
        """Move the finished local file `source` into the store under `key`, whole or not at all."""

    @abstractmethod
    async def read(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` (inclusive) of the object, in chunks.

        The object is opened before this returns, so a missing object or an outage raises here,
        before any answer has been started.
        """

    async def presigned_get(self, key: str, ttl_sec: int) -> str | None:
        """A URL anyone holding it may GET the object from (Range included) for `ttl_sec`; None: no such URL."""
        return None

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object; a missing one is not an error."""
