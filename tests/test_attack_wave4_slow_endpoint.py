"""Attacks by a hostile slow endpoint (`source: {kind: http}`) on the backend: an answer in another protocol, a
flood of headers, a body shorter than announced, chunks that do not parse. Each attempt fails as retryable with
a clear error, the task ends FAILED after its attempts, the backend stays well (memory bounded by the HTTP
client's limits) and logs no traceback."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import backend_config
from tests.helpers import backend_create, wait_status
from tests.procs import Service, free_port, stand_in

KINDS = ("not_http", "header_flood", "short", "bad_chunks")


@pytest.fixture
def garbage() -> Iterator[str]:
    port = free_port()
    with stand_in([sys.executable, "-m", "tests.garbage_endpoint", str(port)], port, "the endpoint") as url:
        yield url


@pytest.fixture
def backend(services: Callable[..., Service], garbage: str, tmp_path: Path) -> Service:
    types = {f"ep_{kind}": {"source": {"kind": "http", "url": f"{garbage}/{kind}", "timeout_sec": 5},
                            "formats": ["raw"], "max_attempts": 2} for kind in KINDS}
    config = backend_config(tmp_path, export_types=types, sources={"allow_hosts": ["127.0.0.1"]})
    return services("backend_stub", config)


def test_a_garbage_answer_fails_each_attempt_as_retryable_and_the_task_as_failed(backend: Service) -> None:
    created = {kind: backend_create(backend.url, {"export_type": f"ep_{kind}"}) for kind in KINDS}
    assert all(resp.status_code == 201 for resp in created.values()), created
    for kind, resp in created.items():
        done = wait_status(backend.url, resp.json()["data"]["task_id"], timeout=20)
        assert done["status"] == "FAILED" and done["attempt"] == 2, (kind, done)
        assert "the endpoint could not be reached" in done["error"]["message"], (kind, done)
    assert httpx.get(f"{backend.url}/healthz", timeout=5).status_code == 200
    assert "Traceback" not in backend.log()
