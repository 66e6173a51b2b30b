"""Result files in a directory: the embedded default, or a file system every backend mounts."""
from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from backend_stub.result_store.base import ObjectMissing, ResultStore, StoreUnavailable

CHUNK = 256 * 1024


class FileResultStore(ResultStore):
    name = "file"

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    async def publish(self, source: Path, key: str) -> None:
        # atomic on one file system; across file systems it is a copy, still never seen half-written
        try:
            await asyncio.to_thread(_move, source, self.root / key)
        except OSError as exc:  # the store's file system is full or failing: worth another try later
            raise StoreUnavailable(f"storing {key} failed: {exc.strerror or type(exc).__name__}") from exc

    async def read(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        try:
            handle = await asyncio.to_thread(open, self.root / key, "rb")
        except FileNotFoundError as exc:
            raise ObjectMissing(key) from exc
        return _chunks(handle, start, end)

    async def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)


def _move(source: Path, target: Path) -> None:
    try:
        os.replace(source, target)
    except OSError:
        staging = target.with_name(f".{target.name}.staging")
        shutil.copyfile(source, staging)
        os.replace(staging, target)
        source.unlink(missing_ok=True)


async def _chunks(handle: BinaryIO, start: int, end: int) -> AsyncIterator[bytes]:
    try:
        await asyncio.to_thread(handle.seek, start)
        left = end - start + 1
        while left > 0 and (data := await asyncio.to_thread(handle.read, min(CHUNK, left))):
            left -= len(data)
            yield data
    finally:
        handle.close()
