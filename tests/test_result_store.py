"""The shared result store on a real S3-compatible server (moto in server mode, started here).

Two backends on one private Redis share one `s3://` store, behind two gateways: a task run by
either backend downloads, whole and by Range, through every gateway and every backend. Expiry
deletes the object; a missing object of a live task is not called "expired"; an outage of the
store answers 503 with Retry-After and leaves the task's record as it was.
"""
from __future__ import annotations

import asyncio
import io
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from backend_stub.byte_range import requested_range
from exports_client import AsyncExportsClient, ExportsClient, Task
from exports_common.errors import ApiError
from tests.conftest import DEMO_KEY, backend_config, gateway_config, synthetic_type
from tests.helpers import assert_envelope_error, backend_create, backend_task, wait_status
from tests.procs import RedisServer, S3Server, Service, backend_headers, wait_until

API = "/api/v1/exports"
PREFIX = "results/v1"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
DEMO_BACKEND = backend_headers("demo")  # a direct call to a backend, as the gateway makes it


@dataclass
class Cluster:
    s3: S3Server
    backends: list[Service]
    gateways: list[Service]

    def submit(self, body: dict[str, object], via: int = 0) -> str:
        resp = httpx.post(f"{self.gateways[via].url}{API}", json=body, headers=AUTH, timeout=10)
        assert resp.status_code == 202, resp.text
        return str(resp.json()["data"]["task_id"])

    def wait(self, task_id: str, via: int = 0) -> dict[str, object]:
        return wait_status(self.gateways[via].url, task_id, path=f"{API}/", headers=AUTH, timeout=60)


def _s3_backend(start: Callable[..., Service], workdir: Path, name: str, redis_url: str, s3: S3Server,
                **override: object) -> Service:
    config = backend_config(workdir / name, redis_url, result_store=f"s3://{s3.bucket}/{PREFIX}", **override)
    return start("backend_stub", config, name=name, **s3.env)


@pytest.fixture(scope="module")
def cluster(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("s3-cluster")
    redis = RedisServer(workdir).start()
    s3 = S3Server(workdir).start()
    try:
        backends = [_s3_backend(module_services, workdir, f"b{i}", redis.url, s3) for i in (1, 2)]
        gateways = [module_services("gateway", gateway_config(workdir / f"g{i}", b.url, redis.url), name=f"g{i}")
                    for i, b in enumerate(backends, 1)]
        yield Cluster(s3, backends, gateways)
    finally:
        s3.stop()
        redis.stop()


def test_a_task_downloads_whole_and_by_range_through_every_gateway_and_every_backend(cluster: Cluster) -> None:
    task_ids = [cluster.submit({"export_type": "report_export"}, via=i % 2) for i in range(4)]
    for task_id in task_ids:
        done = cluster.wait(task_id)
        result = done["result"]
        assert isinstance(result, dict)
        assert f"{PREFIX}/{task_id}.csv" in cluster.s3.object_keys()
        assert not list((Path(cluster.backends[0].config["data_dir"]) / "files").glob(f"{task_id}*"))
        assert not list((Path(cluster.backends[1].config["data_dir"]) / "files").glob(f"{task_id}*"))
        link = str(result["download_url"]).split(API, 1)[1]
        bodies = []
        for gateway in cluster.gateways:
            whole = httpx.get(f"{gateway.url}{API}{link}", timeout=10)
            part = httpx.get(f"{gateway.url}{API}{link}", headers={"Range": "bytes=4-9"}, timeout=10)
            tail = httpx.get(f"{gateway.url}{API}{link}", headers={"Range": "bytes=-5"}, timeout=10)
            assert whole.status_code == 200 and len(whole.content) == result["bytes"], whole.text[:300]
            assert part.status_code == 206 and part.content == whole.content[4:10]
            assert part.headers["content-range"] == f"bytes 4-9/{result['bytes']}"
            assert tail.status_code == 206 and tail.content == whole.content[-5:]
            bodies.append(whole.content)
        for backend in cluster.backends:
            file_url = f"{backend.url}/exports/{task_id}/file"
            whole = httpx.get(file_url, headers=DEMO_BACKEND, timeout=10)
            part = httpx.get(file_url, headers=DEMO_BACKEND | {"Range": "bytes=0-2"}, timeout=10)
            assert whole.status_code == 200 and part.status_code == 206
            bodies.append(whole.content)
            assert part.content == whole.content[:3]
        assert len(set(bodies)) == 1 and bodies[0].startswith(b"day,region,metric,value")


def test_a_range_past_the_end_answers_416_with_the_size(cluster: Cluster) -> None:
    task_id = cluster.submit({"export_type": "report_export"})
    size = cluster.wait(task_id)["result"]["bytes"]  # type: ignore[index]
    resp = httpx.get(f"{cluster.backends[1].url}/exports/{task_id}/file",
                     headers=DEMO_BACKEND | {"Range": f"bytes={size}-"}, timeout=10)
    assert_envelope_error(resp, 416, 41600)
    assert resp.headers["content-range"] == f"bytes */{size}"


def test_a_missing_object_of_a_live_task_is_not_called_expired(cluster: Cluster) -> None:
    task_id = cluster.submit({"export_type": "report_export"})
    cluster.wait(task_id)
    cluster.s3.delete(f"{PREFIX}/{task_id}.csv")
    for backend in cluster.backends:
        resp = httpx.get(f"{backend.url}/exports/{task_id}/file", headers=DEMO_BACKEND, timeout=10)
        body = assert_envelope_error(resp, 410, 41002)
        assert "no longer in the result store" in body["message"] and "has not expired" in body["message"]
    assert backend_task(cluster.backends[0].url, task_id, "demo")["status"] == "COMPLETED"


def test_expiry_deletes_the_object_then_the_task(services: Callable[..., Service], tmp_path: Path) -> None:
    redis = RedisServer(tmp_path).start()
    s3 = S3Server(tmp_path).start()
    try:
        backend = _s3_backend(services, tmp_path, "short", redis.url, s3, task_ttl_sec=2, sweep_interval_sec=0.2)
        task_id = str(backend_create(backend.url, {"export_type": "report_export"}).json()["data"]["task_id"])
        wait_status(backend.url, task_id)
        assert s3.object_keys() == [f"{PREFIX}/{task_id}.csv"]
        wait_until(lambda: s3.object_keys() == [], 15, what="the janitor to delete the object")
        wait_until(lambda: httpx.get(f"{backend.url}/exports/{task_id}",
                                     headers=backend_headers("t1")).status_code == 404, 10,
                   what="the task record to be deleted")
    finally:
        s3.stop()
        redis.stop()


def test_an_s3_outage_answers_503_with_retry_after_and_keeps_the_task(
        services: Callable[..., Service], tmp_path: Path) -> None:
    redis = RedisServer(tmp_path).start()
    s3 = S3Server(tmp_path).start()
    try:
        backend = _s3_backend(services, tmp_path, "b", redis.url, s3)
        gateway = services("gateway", gateway_config(tmp_path / "g", backend.url, redis.url), name="g")
        resp = httpx.post(f"{gateway.url}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=10)
        task_id = resp.json()["data"]["task_id"]
        done = wait_status(gateway.url, task_id, path=f"{API}/", headers=AUTH, timeout=60)
        s3.kill()
        download = httpx.get(str(done["result"]["download_url"]), timeout=20)
        assert_envelope_error(download, 503, 50300)
        assert int(download.headers["retry-after"]) >= 1
        direct = httpx.get(f"{backend.url}/exports/{task_id}/file", headers=DEMO_BACKEND, timeout=20)
        assert_envelope_error(direct, 503, 50300)
        assert int(direct.headers["retry-after"]) >= 1
        after = backend_task(backend.url, task_id, "demo")
        assert after["status"] == "COMPLETED" and after["result"] == done["result"] | {
            "download_url": after["result"]["download_url"]}
    finally:
        s3.stop()
        redis.stop()


def test_an_s3_outage_during_uploads_is_waited_out_without_spending_attempts_until_the_timeout(
        services: Callable[..., Service], tmp_path: Path) -> None:
    redis = RedisServer(tmp_path).start()
    s3 = S3Server(tmp_path).start()
    try:
        backend = _s3_backend(services, tmp_path, "b", redis.url, s3)
        s3.kill()
        # report_export has max_attempts 2: were each failed upload an attempt, both would be FAILED in seconds
        waits = backend_create(backend.url, {"export_type": "report_export", "timeout_sec": 120}, tenant="demo")
        gives_up = backend_create(backend.url, {"export_type": "report_export", "timeout_sec": 5}, tenant="demo")
        waiting, timed_out = (str(r.json()["data"]["task_id"]) for r in (waits, gives_up))
        ended = wait_status(backend.url, timed_out, timeout=30, headers=DEMO_BACKEND)
        assert ended["status"] == "TIMEOUT" and ended["attempt"] == 1, ended
        assert ended["error"]["retryable"] and "result store" in ended["error"]["message"], ended["error"]
        still = backend_task(backend.url, waiting, "demo")
        assert (still["status"], still["attempt"], still["current_step"]) == ("RUNNING", 1, "store"), still

        s3.start()  # back (empty, as moto is after a restart, with its bucket made again)
        done = wait_status(backend.url, waiting, timeout=60, headers=DEMO_BACKEND)
        assert (done["status"], done["attempt"], done["error"]) == ("COMPLETED", 1, None), done
        assert s3.object_keys() == [f"{PREFIX}/{waiting}.csv"]
        metrics = httpx.get(f"{backend.url}/metrics", headers=DEMO_BACKEND, timeout=10).text
        assert re.search(r"^backend_result_store_retries_total [1-9]", metrics, re.M), metrics
    finally:
        s3.stop()
        redis.stop()


def test_memory_stays_flat_uploading_and_streaming_a_big_file(cluster: Cluster) -> None:
    backend = cluster.backends[0]
    idle = [b.rss_bytes() for b in cluster.backends]
    peak = list(idle)
    stop = threading.Event()

    def sample() -> None:  # both: either backend's worker may run the export and upload it
        while not stop.wait(0.05):
            peak[:] = [max(p, b.rss_bytes()) for p, b in zip(peak, cluster.backends, strict=True)]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        created = backend_create(backend.url, {"export_type": "big_export"}, tenant="demo")
        task_id = str(created.json()["data"]["task_id"])
        size = int(wait_status(backend.url, task_id, timeout=120, tenant="demo")["result"]["bytes"])
        received = 0
        with httpx.stream("GET", f"{backend.url}/exports/{task_id}/file", headers=DEMO_BACKEND, timeout=60) as resp:
            assert resp.status_code == 200
            for chunk in resp.iter_bytes():
                received += len(chunk)
    finally:
        stop.set()
        sampler.join()
    grown = [p - i for p, i in zip(peak, idle, strict=True)]
    print(f"file {size / 2**20:.1f} MiB; backend RSS growth {[round(g / 2**20, 1) for g in grown]} MiB")
    assert received == size and size > 40 * 2**20
    # upload parts in flight (2 x 5 MiB) and read chunks bound it, whatever the file's size
    assert max(grown) < 30 * 2**20, (idle, peak, size)


@pytest.mark.parametrize(("header", "expected"), [
    (None, None), ("bytes=0-9", (0, 9)), ("bytes=5-", (5, 99)), ("bytes=-10", (90, 99)),
    ("bytes=-500", (0, 99)), ("bytes=90-500", (90, 99)), ("bytes=0-1,5-6", None), ("items=0-5", None),
    ("bytes=5-1", None),  # last before first: invalid, ignored (RFC 9110 14.1.1)
])
def test_range_header_parsing(header: str | None, expected: tuple[int, int] | None) -> None:
    assert requested_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=-0", "bytes=150-200"])
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(ApiError) as caught:
        requested_range(header, 100)
    assert caught.value.kind.status == 416


@pytest.mark.parametrize("header", ["bytes=-", "bytes=abc", "bytes=1-x"])
def test_unreadable_byte_ranges_are_refused_not_ignored(header: str) -> None:
    with pytest.raises(ApiError) as caught:
        requested_range(header, 100)
    assert caught.value.kind.status == 400


class _Recording(httpx.HTTPTransport):
    """The real transport, noting for each request its host and whether it carried the API key."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bool]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.url.netloc.decode(), "authorization" in request.headers))
        return super().handle_request(request)


def test_an_opt_in_redirect_sends_downloads_to_a_presigned_store_url(
        services: Callable[..., Service], tmp_path: Path, cluster: Cluster) -> None:
    s3 = cluster.s3
    public = f"http://localhost:{s3.port}"  # another name of the store's host: URLs are signed for this one
    backend = _s3_backend(services, tmp_path, "redirecting", "", s3, task_ttl_sec=8,
                          download_redirect={"ttl_sec": 300, "public_endpoint": public})
    gateway = services("gateway", gateway_config(tmp_path / "g", backend.url), name="g")
    transport = _Recording()
    with ExportsClient(gateway.url, DEMO_KEY, transport=transport) as client:
        task = client.wait(client.submit("report_export").task_id, max_wait=30)
        assert task.result is not None
        link = task.result.download_url
        answer = httpx.get(link, timeout=10)
        assert answer.status_code == 307 and answer.headers["cache-control"] == "no-store"
        location = answer.headers["location"]
        assert location.startswith(f"{public}/{s3.bucket}/{PREFIX}/{task.task_id}.csv?")
        assert 1 <= int(parse_qs(urlsplit(location).query)["X-Amz-Expires"][0]) <= 8  # never past the expiry
        whole = httpx.get(location, timeout=10)
        part = httpx.get(location, headers={"Range": "bytes=4-9"}, timeout=10)
        assert whole.status_code == 200 and len(whole.content) == task.result.bytes
        assert part.status_code == 206 and part.content == whole.content[4:10]

        dest = tmp_path / "out.csv"
        Path(f"{dest}.part").write_bytes(whole.content[:7])  # an interrupted download, resumed by Range
        assert client.download(task, dest) == dest and dest.read_bytes() == whole.content
        assert asyncio.run(_download_async(gateway.url, task)) == whole.content
    store_host = f"localhost:{s3.port}"
    assert (store_host, False) in transport.seen and (store_host, True) not in transport.seen  # no key to the store

    wait_until(lambda: httpx.get(f"{backend.url}/exports/{task.task_id}/file", headers=DEMO_BACKEND,
                                 timeout=5).status_code == 410, 20, what="the task to expire")
    assert httpx.get(link, timeout=10).status_code == 410


async def _download_async(url: str, task: Task) -> bytes:
    sink = io.BytesIO()
    async with AsyncExportsClient(url, DEMO_KEY) as client:
        await client.download(task, sink)
    return sink.getvalue()


def test_a_redirect_needs_an_s3_store() -> None:
    from pydantic import ValidationError

    from backend_stub.config import BackendConfig

    config = {"export_types": {"orders": synthetic_type("orders", 100)}, "download_redirect": {"ttl_sec": 60}}
    with pytest.raises(ValidationError, match="needs an s3:// result_store"):
        BackendConfig.model_validate(config)
    BackendConfig.model_validate(config | {"result_store": "s3://b/p"})
