"""Result files in an S3-compatible object store (AWS S3, MinIO, Ceph, moto), through obstore.

Connection settings come from the standard variables AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and AWS_REGION. With an endpoint URL, requests are path-style
(`ENDPOINT/BUCKET/KEY`), as MinIO and local servers expect. The bucket must exist; objects
live under PREFIX. Uploads are multipart from the spool file and downloads are ranged
streams, so memory stays at a few chunks whatever the file's size.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import BaseError
from obstore.store import S3Store

from backend_stub.result_store.base import ObjectMissing, ResultStore, StoreUnavailable

if TYPE_CHECKING:
    from obstore import BytesStream

PART_BYTES = 5 * 1024 * 1024  # the smallest part S3 allows: the least memory per part in flight
PARTS_IN_FLIGHT = 2
READ_CHUNK = 256 * 1024


class S3ResultStore(ResultStore):
    name = "s3"

    def __init__(self, bucket: str, prefix: str, public_endpoint: str = "") -> None:
        if not bucket:
            raise ValueError("result_store s3://BUCKET/PREFIX needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix
        self.store = _open(bucket, prefix, os.environ.get("AWS_ENDPOINT_URL", ""))
        # signing is offline: a URL for clients is signed for the host they will send it to
        self.signer = _open(bucket, prefix, public_endpoint) if public_endpoint else self.store

    async def publish(self, source: Path, key: str) -> None:
        try:
            await obstore.put_async(self.store, key, source, chunk_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT)
        except (BaseError, OSError) as exc:
            raise StoreUnavailable(f"upload of {key} failed: {exc}") from exc
        await asyncio.to_thread(source.unlink, missing_ok=True)

    async def read(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        try:
            result = await obstore.get_async(self.store, key, options={"range": (start, end + 1)})
        except FileNotFoundError as exc:
            raise ObjectMissing(key) from exc
        except (BaseError, OSError) as exc:
            raise StoreUnavailable(f"read of {key} failed: {exc}") from exc
        return _chunks(result.stream(min_chunk_size=READ_CHUNK))

    async def presigned_get(self, key: str, ttl_sec: int) -> str | None:
        try:
            return await obstore.sign_async(self.signer, "GET", key, timedelta(seconds=ttl_sec))
        except (BaseError, OSError) as exc:  # no credentials to sign with (they may come from an expired role)
            raise StoreUnavailable(f"signing a URL for {key} failed: {exc}") from exc

    async def delete(self, key: str) -> None:
        try:
            await obstore.delete_async(self.store, key)
        except FileNotFoundError:
            return
        except (BaseError, OSError) as exc:
            raise StoreUnavailable(f"delete of {key} failed: {exc}") from exc


def _open(bucket: str, prefix: str, endpoint: str) -> S3Store:
    """A client of the bucket; path-style at an explicit endpoint (as MinIO and local servers expect)."""
    return S3Store(
        bucket, prefix=prefix or None, endpoint=endpoint or None,
        virtual_hosted_style_request=not endpoint,
        client_options={"allow_http": endpoint.startswith("http://"), "connect_timeout": timedelta(seconds=2),
                        "timeout": timedelta(seconds=60)},
        # an outage answers the client 503 quickly rather than after minutes of retries
        retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=5)},
    )


async def _chunks(stream: BytesStream) -> AsyncIterator[bytes]:
    async for chunk in stream:
        yield bytes(chunk)
