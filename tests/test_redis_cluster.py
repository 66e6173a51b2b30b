"""Both processes on a real Redis Cluster of three nodes: every feature that keeps state in Redis works there.

The cluster refuses a command whose keys span slots (CROSSSLOT), and redis-py's cluster
client refuses such a transaction or MGET before sending it, so a layout that is not
hash-tagged right fails these requests. The keys are also checked to land on more than
one node (the test would prove little if everything sat on one), and every key but the
single-key caches is checked to carry a hash tag.
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Callable

import httpx

from backend_stub.models import Task
from backend_stub.store.redis_store import RedisTaskStore
from exports_common.task_ids import new_task_id
from tests.conftest import ADMIN_TOKEN, DEMO_KEY, backend_config, gateway_config
from tests.helpers import backend_create, wait_status
from tests.procs import RedisClusterServers, Service, backend_headers, wait_until

API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TENANT = backend_headers("demo")
BODY = {"export_type": "report_export"}


def _tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: what is between the first `{` and the next `}` if that is not
    empty, else the whole key."""
    found = re.match(r"[^{]*\{([^}]+)\}", key)
    return found.group(1) if found else key


def test_submit_poll_list_download_and_the_outbox_run_on_a_redis_cluster(
        services: Callable[..., Service], tmp_path: Path, redis_cluster: RedisClusterServers) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_cluster.url))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, redis_cluster.url))
    assert httpx.get(f"{backend.url}/readyz").status_code == httpx.get(f"{gateway.url}/readyz").status_code == 200

    key = {"Idempotency-Key": f"cluster-{time.time_ns()}"}
    created = httpx.post(gateway.url + API, json=BODY, headers=AUTH | key, timeout=10)
    replayed = httpx.post(gateway.url + API, json=BODY, headers=AUTH | key, timeout=10)
    assert created.status_code == replayed.status_code == 202, created.text
    task_id = created.json()["data"]["task_id"]
    assert replayed.json()["data"]["task_id"] == task_id and replayed.headers["idempotent-replayed"] == "true"

    wait_status(backend.url, task_id, {"COMPLETED"}, headers=TENANT)
    miss = httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH)
    hit = httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH)
    assert (miss.headers["x-cache"], hit.headers["x-cache"]) == ("MISS", "HIT") and hit.json() == miss.json()
    listed = httpx.get(gateway.url + API, headers=AUTH).json()["data"]["items"]
    assert task_id in [item["task_id"] for item in listed]

    link = miss.json()["data"]["result"]["download_url"]
    whole = httpx.get(link, timeout=10)
    part = httpx.get(link, headers={"Range": "bytes=0-9"}, timeout=10)
    assert whole.status_code == 200 and len(whole.content) == miss.json()["data"]["result"]["bytes"]
    assert part.status_code == 206 and part.content == whole.content[:10]
    metrics = httpx.get(f"{backend.url}/metrics", headers=TENANT).text
    assert re.search(r'backend_tasks\{status="COMPLETED",tenant="demo"\} [1-9]', metrics), metrics[-2000:]

    # the backend is down: a submit goes to the shared outbox (a script over three keys), then is delivered
    backend.kill()
    outboxed = httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": f"ob-{time.time_ns()}"},
                          timeout=30)
    assert outboxed.status_code == 202 and outboxed.json()["data"]["degraded"] is True, outboxed.text
    backend.start()
    wait_status(backend.url, outboxed.json()["data"]["task_id"], {"COMPLETED"}, timeout=20, headers=TENANT)
    wait_until(lambda: httpx.get(f"{gateway.url}/admin/stats", headers=ADMIN)
               .json()["data"]["outbox"]["pending"] == 0, 10, what="the outbox to drain")

    keys = redis_cluster.keys()
    everything = [k for node in keys.values() for k in node]
    assert sum(1 for node in keys.values() if node) >= 2, keys  # the state is spread, so routing was exercised
    assert any(k.startswith("gw:idem:{demo}:") for k in everything)
    assert any(k.startswith("{exports}:task:") for k in everything) and "{exports}:tenants" in everything
    # only keys that no script, transaction or multi-key command touches may go without a hash tag
    untagged = [k for k in everything if _tag(k) == k and not k.startswith(("gw:cache:", "gw:seen:"))]
    assert not untagged, untagged
    for service in (backend, gateway):
        assert not re.search(r"CROSSSLOT|RedisCluster|Traceback", service.log()), service.log()[-3000:]
    # the limiter's script ran on the cluster (its keys live a few microseconds under the tests' raised limits)
    assert "rate limits: Redis unreachable" not in gateway.log()


def test_a_dead_node_answers_503_with_retry_after_and_its_restart_is_recovered_from(
        services: Callable[..., Service], tmp_path: Path, redis_cluster: RedisClusterServers) -> None:
    backend = services("backend_stub", backend_config(tmp_path, redis_cluster.url))
    gateway = services("gateway", gateway_config(tmp_path, backend.url, redis_cluster.url))
    store_node = redis_cluster.owner("{exports}")
    task_id = httpx.post(gateway.url + API, json=BODY, headers=AUTH, timeout=10).json()["data"]["task_id"]
    wait_status(backend.url, task_id, {"COMPLETED"}, headers=TENANT)

    redis_cluster.kill(store_node)
    direct = httpx.get(f"{backend.url}/exports/{task_id}", headers=TENANT, timeout=10)
    assert direct.status_code == 503 and int(direct.headers["retry-after"]) >= 1, direct.text
    # the backend answers 503: the gateway outboxes the submit, or answers 503 if the outbox's node is the dead one
    submit = httpx.post(gateway.url + API, json=BODY, headers=AUTH | {"Idempotency-Key": "node-down"}, timeout=10)
    assert (submit.status_code == 202 and submit.json()["data"]["degraded"]) or (
        submit.status_code == 503 and int(submit.headers["retry-after"]) >= 1), submit.text
    assert httpx.get(f"{backend.url}/readyz", timeout=10).status_code == 503  # its store's node, not any node

    redis_cluster.restart(store_node)  # without persistence: the backend's store comes back empty
    wait_until(lambda: httpx.get(f"{backend.url}/readyz", timeout=5).status_code == 200, 15, what="backend ready")
    created = backend_create(backend.url, BODY, tenant="demo")  # its queue's group is back
    assert created.status_code == 201, created.text
    fresh = created.json()["data"]["task_id"]
    wait_status(backend.url, fresh, {"COMPLETED"}, timeout=20, headers=TENANT)
    assert httpx.get(f"{backend.url}/exports/{task_id}", headers=TENANT, timeout=10).status_code == 404


def _task() -> Task:
    now = time.time()
    return Task(task_id=new_task_id(), tenant="demo", export_type="report_export", filters={}, format="csv",
                timeout_sec=60, callback_url=None, fingerprint="f", created_at=now, updated_at=now)


async def test_the_first_writes_after_a_node_restarted_find_a_live_connection(
        redis_cluster: RedisClusterServers) -> None:
    """Connections pooled to a node before it restarted are closed under the client; nothing used them since
    (a restart quicker than their health check). A create's or an update's WATCH is sent on one: each answered
    503 (a ConnectionError) until the stale ones were used up, while the node answered again."""
    prefix = f"restart{time.time_ns()}"
    store = RedisTaskStore(redis_cluster.url, prefix)
    try:
        written = await asyncio.gather(*(store.create(_task()) for _ in range(8)))  # eight pooled connections
        node = redis_cluster.owner("{" + prefix + "}")
        redis_cluster.kill(node)
        redis_cluster.restart(node)  # empty: no persistence
        assert [(await store.create(_task()))[1] for _ in range(6)] == [True] * 6
        redis_cluster.kill(node)
        redis_cluster.restart(node)
        lost = written[0][0].task_id  # its record went with the node's data: a repeated create writes it anew
        assert (await store.update(lost, lambda task: task)) == (None, False)
        again = await store.create(written[0][0])
        assert again[1] and again[0].task_id == lost
    finally:
        await store.close()
