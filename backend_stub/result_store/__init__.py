"""Where finished result files live, so that every backend process can serve every task's file.

`file://PATH` keeps them on a local (or shared) file system; `s3://BUCKET/PREFIX` keeps them in
any S3-compatible object store. Exports are written to a local spool file first and then
published here in one step, so a reader never sees half a file.
"""
from __future__ import annotations

from backend_stub.result_store.base import (
    ObjectMissing,
    ResultStore,
    StoreUnavailable,
    object_key,
)
from backend_stub.result_store.file import FileResultStore
from backend_stub.result_store.s3 import S3ResultStore


def open_result_store(url: str, data_dir: str, public_endpoint: str = "") -> ResultStore:
    """The store named by `url`; empty means `file://` under `data_dir`.

    `public_endpoint`: where clients reach an s3:// store, for the URLs signed for them.
    """
    if not url:
        return FileResultStore(f"{data_dir}/files")
    if url.startswith("file://"):
        return FileResultStore(url.removeprefix("file://"))
    if url.startswith("s3://"):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return S3ResultStore(bucket, prefix.strip("/"), public_endpoint)
    raise ValueError(f"result_store {url!r}: use file://PATH or s3://BUCKET/PREFIX")


__all__ = ["ObjectMissing", "ResultStore", "StoreUnavailable", "object_key", "open_result_store"]
