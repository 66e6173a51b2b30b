"""Choosing the S3 client for the result store: obstore against aiobotocore, on one moto server.

Each client runs in its own child process (so import cost and peak RSS are its own): it
uploads one file from disk as a multipart upload, then streams it back whole and by one
Range, discarding the bytes. Reported: import time, MiB/s both ways, and peak RSS above the
RSS after import (what the transfer itself holds).

    pip install aiobotocore   # not a project dependency: only this comparison uses it
    python -m benchmarks.s3_clients [--mib 256]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.procs import S3Server

PART = 8 * 1024 * 1024


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _obstore(path: Path, bucket: str) -> tuple[float, float, int]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, prefix="bench", client_options={"allow_http": True}, virtual_hosted_style_request=False)
    start = time.perf_counter()
    await obstore.put_async(store, "big.bin", path, chunk_size=PART, max_concurrency=4)
    up = time.perf_counter() - start
    start = time.perf_counter()
    got = 0
    async for chunk in (await obstore.get_async(store, "big.bin")).stream(min_chunk_size=256 * 1024):
        got += len(chunk)
    ranged = await obstore.get_async(store, "big.bin", options={"range": (1000, 2000)})
    got += len(await ranged.bytes_async())
    return up, time.perf_counter() - start, got


async def _aiobotocore(path: Path, bucket: str) -> tuple[float, float, int]:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(s3={"addressing_style": "path"})
    async with get_session().create_client("s3", config=config) as s3:
        start = time.perf_counter()
        upload = await s3.create_multipart_upload(Bucket=bucket, Key="bench/big2.bin")
        parts = []
        with open(path, "rb") as f:
            number = 1
            while data := f.read(PART):
                part = await s3.upload_part(Bucket=bucket, Key="bench/big2.bin", PartNumber=number,
                                            UploadId=upload["UploadId"], Body=data)
                parts.append({"PartNumber": number, "ETag": part["ETag"]})
                number += 1
        await s3.complete_multipart_upload(Bucket=bucket, Key="bench/big2.bin", UploadId=upload["UploadId"],
                                           MultipartUpload={"Parts": parts})
        up = time.perf_counter() - start
        start = time.perf_counter()
        got = 0
        response = await s3.get_object(Bucket=bucket, Key="bench/big2.bin")
        async for chunk in response["Body"].iter_chunks(256 * 1024):
            got += len(chunk)
        response = await s3.get_object(Bucket=bucket, Key="bench/big2.bin", Range="bytes=1000-1999")
        got += len(await response["Body"].read())
        return up, time.perf_counter() - start, got


def child(client: str, path: Path, bucket: str) -> dict[str, Any]:
    start = time.perf_counter()
    if client == "obstore":
        import obstore  # noqa: F401
        run = _obstore
    else:
        import aiobotocore.session  # noqa: F401
        run = _aiobotocore
    imported = time.perf_counter() - start
    base = _rss_mib()
    up, down, got = asyncio.run(run(path, bucket))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mib = path.stat().st_size / 2**20
    assert got == path.stat().st_size + 1000, got
    return {"client": client, "import_ms": round(imported * 1000), "upload_mib_s": round(mib / up, 1),
            "download_mib_s": round(mib / down, 1), "rss_after_import_mib": round(base, 1),
            "peak_above_import_mib": round(peak - base, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--child", choices=["obstore", "aiobotocore"])
    parser.add_argument("--file")
    parser.add_argument("--bucket", default="bench")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.file), args.bucket)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = S3Server(Path(tmp), bucket="bench").start()
        try:
            path = Path(tmp) / "big.bin"
            with open(path, "wb") as f:
                for _ in range(args.mib):
                    f.write(os.urandom(1 << 20))
            env = dict(os.environ, **server.env)
            for client in ("obstore", "aiobotocore", "obstore", "aiobotocore"):
                out = subprocess.run([sys.executable, "-m", "benchmarks.s3_clients", "--child", client,
                                      "--file", str(path)], env=env, capture_output=True, text=True)
                print(out.stdout.strip() or out.stderr[-2000:])
                continue
                print(out.stdout.strip())
        finally:
            server.stop()


if __name__ == "__main__":
    main()
