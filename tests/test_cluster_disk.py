"""A full disk under one backend of `make cluster`: a real, small file system (tmpfs) as b1's data_dir.

Below `min_free_bytes` b1 claims nothing and its /readyz says why (503); an export whose file fills
the disk mid-write goes back to the queue without spending an attempt and completes on b2; once space
is back, b1 is ready and claims again. No task is FAILED with a bare "OSError".
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exports_common.dev_mode import DEMO_API_KEYS
from tests.cluster_run import RunningCluster
from tests.helpers import wait_status
from tests.procs import wait_until

AUTH = {"Authorization": f"Bearer {DEMO_API_KEYS['demo']}"}
API = "/api/v1/exports"
DISK_BYTES = 32 << 20
MIN_FREE_BYTES = 4 << 20  # an order_export's file is about 9 MiB: more than the room left below


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 32 MiB tmpfs (memory only, gone at unmount) mounted where the cluster puts b1's data."""
    data = tmp_path_factory.mktemp("cluster-disk")
    mount_point = data / "b1"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0755", "tmpfs",
                              str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk test (the suite runs as root): {mounted.stderr}")
    try:
        yield data
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)


@pytest.fixture(scope="module")
def cluster(small_disk: Path) -> Iterator[RunningCluster]:
    running = RunningCluster(small_disk, env={"BACKEND_MIN_FREE_BYTES": str(MIN_FREE_BYTES)}).start()
    try:
        yield running
    finally:
        status = running.stop()
    assert status == 0, running.output()[-3000:]


def _fill(disk: Path, leave: int) -> None:
    """Grow (or shrink) a filler file until about `leave` bytes are free on the disk."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    size = max(0, (filler.stat().st_size if filler.exists() else 0) + free - leave)
    with open(filler, "wb") as out:
        out.truncate(0)
        out.write(b"\0" * size)  # written, not a sparse truncate: tmpfs counts only pages in use


def _ready(cluster: RunningCluster, name: str) -> httpx.Response:
    return httpx.get(f"{cluster.url(name)}/readyz", timeout=10)


def _submit(cluster: RunningCluster, export_type: str) -> str:
    resp = httpx.post(f"{cluster.lb}{API}", json={"export_type": export_type}, headers=AUTH, timeout=20)
    assert resp.status_code == 202, resp.text
    return str(resp.json()["data"]["task_id"])


def test_a_backend_short_of_disk_claims_nothing_says_why_and_gives_a_full_disk_task_back(
        cluster: RunningCluster, small_disk: Path) -> None:
    disk = small_disk / "b1"
    assert _ready(cluster, "b1").status_code == 200

    _fill(disk, 1 << 20)  # below min_free_bytes
    not_ready = wait_until(lambda: (r := _ready(cluster, "b1")).status_code == 503 and r, 10,
                           what="b1 to report not ready")
    body = not_ready.json()
    assert body["data"]["reason"] == "disk_full" and "below min_free_bytes" in body["message"], body
    assert int(not_ready.headers["retry-after"]) >= 1
    started_before = cluster.log("b1").count('"task started"')
    small = [_submit(cluster, "report_export") for _ in range(4)]
    for task_id in small:
        assert wait_status(cluster.lb, task_id, path=f"{API}/", headers=AUTH, timeout=60)["status"] == "COMPLETED"
    assert cluster.log("b1").count('"task started"') == started_before  # b2 ran them all

    _fill(disk, 6 << 20)  # above min_free_bytes, but less than one order_export's file
    wait_until(lambda: _ready(cluster, "b1").status_code == 200, 10, what="b1 to take work again")
    big = [_submit(cluster, "order_export") for _ in range(6)]  # b1's two workers take some of them
    done = [wait_status(cluster.lb, task_id, path=f"{API}/", headers=AUTH, timeout=120) for task_id in big]
    assert [task["status"] for task in done] == ["COMPLETED"] * len(big), [task["error"] for task in done]
    log = cluster.log("b1")
    assert "the disk filled up under the export" in log, log[-3000:]
    assert "OSError" not in log.split("the disk filled up under the export", 1)[0][-2000:]
    # that export would fail again: b1 waits for real room, and says so
    waiting = _ready(cluster, "b1")
    assert waiting.status_code == 503 and "ran out of space" in waiting.json()["message"], waiting.text

    (disk / "filler").unlink()
    wait_until(lambda: _ready(cluster, "b1").status_code == 200, 10, what="b1 to be ready once space is back")
    assert "disk space is back: claiming tasks again" in cluster.log("b1")
