"""`make cluster` and compose.yaml: one topology; a real round trip through the load balancer; and the
faults the cluster exists to show, on `make cluster` itself: a node killed is restarted alone, a frozen
gateway does not hold polls, and two backends deliver each callback once though the receiver is slow.
"""
from __future__ import annotations

import collections
import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from exports_common.dev_mode import DEMO_API_KEYS
from scripts import run_cluster
from tests.cluster_run import RunningCluster
from tests.helpers import wait_status
from tests.procs import ROOT, wait_until
from tests.receiver import Receiver

# `make cluster` is a local trial in dev mode: the published demo key is what its users type
AUTH = {"Authorization": f"Bearer {DEMO_API_KEYS['demo']}"}
API = "/api/v1/exports"


def _nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        pytest.fail("nginx is not installed (apt-get install nginx-light; .ci/run and make cluster install it)")
    return found


# -- compose.yaml and the load balancer's config, made from the topology (no process) -----------------

def test_compose_yaml_is_made_from_the_topology_run_cluster_starts() -> None:
    on_disk = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert on_disk == run_cluster.compose(), "stale: python -m scripts.run_cluster compose > compose.yaml"
    services = on_disk["services"]
    assert list(services) == [node.name for node in run_cluster.TOPOLOGY]
    for node in run_cluster.TOPOLOGY:
        service = services[node.name]
        assert service["command"][-3:] == [node.name, "--hosts", "compose"]
        assert service.get("depends_on", {}) == {name: {"condition": "service_healthy"} for name in node.after}
        # every address a node's settings name is a node of the topology, started before it
        for value in node.env.values():
            for named in re.findall(r"\{(\w+)\}", value):
                known = ("data", "redis_password", "service_token", "lb")
                assert named in known or named in node.after, (node.name, named)
    assert services["lb"]["ports"] == [f"{run_cluster.NODES['lb'].port}:{run_cluster.NODES['lb'].port}"]
    kinds = [node.kind for node in run_cluster.TOPOLOGY]
    assert kinds.count("backend") == 2 and kinds.count("gateway") == 2 and kinds.count("lb") == 1


def test_compose_yaml_can_start_redis_needs_its_password_and_every_node_is_checked_and_restarted() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"] == ["CMD", "python", "-m", "scripts.run_cluster", "check", name,
                                                  "--hosts", "compose"], name
        # compose refuses to start without a password: Redis 7 refuses other containers without one
        assert service["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?"), name
    redis_volume = compose["services"]["redis"]["volumes"][0].split(":")
    assert redis_volume[0] in compose["volumes"] and redis_volume[1] == "/app/.data/cluster/redis"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-slim-\w+", dockerfile, re.M), "the base image is pinned"
    assert "-r deploy/requirements.lock" in dockerfile and "--no-deps" in dockerfile
    lock = (ROOT / "deploy" / "requirements.lock").read_text().splitlines()
    pins = dict(line.split("==") for line in lock if line and not line.startswith("#"))
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version) for version in pins.values()), pins
    assert {"starlette", "uvicorn", "redis", "moto", "flask", "obstore"} <= set(pins)


def test_compose_config_accepts_the_file_when_docker_compose_is_here(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    plugin = docker is not None and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    if not plugin:
        # no compose plugin (no daemon is needed, but the plugin is): the YAML is checked as compose reads it
        compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
        assert set(compose) == {"name", "services", "volumes"}
        for service in compose["services"].values():
            assert set(service) <= {"build", "image", "command", "environment", "restart", "healthcheck",
                                    "depends_on", "volumes", "ports"}
            assert set(service["healthcheck"]) == {"test", "interval", "timeout", "retries", "start_period"}
        return
    assert docker is not None
    refused = subprocess.run([docker, "compose", "-f", str(ROOT / "compose.yaml"), "config", "--quiet"],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0 and "REDIS_PASSWORD" in refused.stderr  # no password: no start
    checked = subprocess.run([docker, "compose", "-f", str(ROOT / "compose.yaml"), "config", "--format", "json"],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": "x" * 32})
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["services"]["redis"]["restart"] == "unless-stopped"


def test_in_compose_nodes_reach_each_other_by_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_PASSWORD", "s3cret/pass")
    monkeypatch.setenv("BACKEND_SERVICE_TOKEN", "a-token-for-this-test-of-32-characters")  # compose requires it
    backend = run_cluster.resolved_env(run_cluster.NODES["b1"], "compose")
    gateway = run_cluster.resolved_env(run_cluster.NODES["g2"], "compose")
    assert backend["REDIS_URL"] == "redis://:s3cret%2Fpass@redis:16379/0" == gateway["REDIS_URL"]
    assert backend["AWS_ENDPOINT_URL"] == "http://s3:19000" and backend["RESULT_STORE_URL"].startswith("s3://")
    assert gateway["BACKEND_URLS"] == "http://b1:18081,http://b2:18082"
    assert gateway["GATEWAY_PUBLIC_URL"] == backend["GATEWAY_PUBLIC_URL"] == "http://lb:18080"
    assert int(backend["TASK_TTL_SEC"]) == 3600  # moto holds every object in memory: results go after an hour
    # the backends answer only the gateways, which send the token compose gives every node
    token = "a-token-for-this-test-of-32-characters"
    assert backend["BACKEND_SERVICE_TOKEN"] == gateway["EXPORT_BACKEND_TOKEN"] == token


def _locations(config: str) -> dict[str, str]:
    """Each `location` block of an nginx config, by its pattern."""
    return {m.group(1).strip(): m.group(2) for m in re.finditer(r"location ([^{]+)\{(.*?)\n        \}", config, re.S)}


def _seconds(block: str, directive: str) -> float:
    found = re.search(rf"^\s*{directive} (\d+)s;", block, re.M)
    assert found, (directive, block)
    return float(found.group(1))


def test_the_load_balancer_gives_event_streams_a_long_unbuffered_location_and_polls_a_short_one(
        tmp_path: Path) -> None:
    path = run_cluster.nginx_config({"GATEWAYS": "127.0.0.1:1,127.0.0.1:2"}, tmp_path, "127.0.0.1:3")
    config = path.read_text()
    checked = subprocess.run([_nginx(), "-t", "-p", str(tmp_path), "-c", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    locations = _locations(config)
    events = locations["~ ^/api/v1/(exports/[^/]+/)?events$"]
    # a comment line comes every 15 s at least: four of them and more before a stream counts as dead
    assert _seconds(events, "proxy_read_timeout") >= 4 * 15
    assert re.search(r"^\s*proxy_buffering off;", events, re.M)
    # passed on to another gateway only on a connect error, which nginx does only before any byte was sent
    assert re.search(r"^\s*proxy_next_upstream error;", events, re.M)
    for pattern, total in (("~ ^/api/v1/exports/[^/]+$", 8), ("= /api/v1/exports", 15)):
        timeout = _seconds(locations[pattern], "proxy_read_timeout")  # the status and submit routes' totals
        assert total < timeout <= total + 3, (pattern, timeout)
        assert timeout < _seconds(events, "proxy_read_timeout")
    directives = "\n".join(line for line in config.splitlines() if not line.lstrip().startswith("#"))
    assert "non_idempotent" not in directives  # a submit that reached a gateway is never sent to another by nginx
    assert re.search(r"error_page 502 504 = @no_gateway;", config)


# -- make cluster itself -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    _nginx()
    running = RunningCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield running
    finally:
        status = running.stop()
    assert status == 0, running.output()[-3000:]


def test_the_cluster_serves_a_submit_to_download_round_trip_through_the_load_balancer(
        cluster: RunningCluster) -> None:
    resp = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=20)
    assert resp.status_code == 202, resp.text
    task_id = resp.json()["data"]["task_id"]
    done = wait_status(cluster.lb, task_id, path=f"{API}/", headers=AUTH, timeout=60)
    link = str(done["result"]["download_url"])
    assert link.startswith(f"{cluster.lb}{API}/{task_id}/download?"), link
    whole = httpx.get(link, timeout=20)
    part = httpx.get(link, headers={"Range": "bytes=10-19"}, timeout=20)
    assert whole.status_code == 200 and len(whole.content) == done["result"]["bytes"]
    assert part.status_code == 206 and part.content == whole.content[10:20]


def test_a_killed_node_is_restarted_alone_with_backoff_and_the_output_names_it(cluster: RunningCluster) -> None:
    others = {name: cluster.pid(name) for name in ("redis", "s3", "b2", "g1", "g2")}
    first = cluster.signal("b1", signal.SIGKILL)
    cluster.wait_serving("b1", 1)
    second = cluster.pid("b1")
    assert second != first
    cluster.signal("b1", signal.SIGKILL)  # again at once: the wait before its restart doubles
    cluster.wait_serving("b1", 2)
    cluster.signal("lb", signal.SIGKILL)  # the load balancer too: it is one more node
    cluster.wait_serving("lb", 1)
    output = cluster.output()
    assert "b1 exited (killed by SIGKILL); restarting it in 1 s" in output
    assert "b1 exited (killed by SIGKILL); restarting it in 2 s" in output
    assert re.search(r"b1 restarted \(restart 2, pid \d+\)", output) and "lb exited (killed by SIGKILL)" in output
    assert {name: cluster.pid(name) for name in others} == others  # nobody else was stopped
    resp = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, headers=AUTH, timeout=20)
    assert resp.status_code == 202, resp.text
    wait_status(cluster.lb, resp.json()["data"]["task_id"], {"COMPLETED"}, path=f"{API}/", headers=AUTH, timeout=60)


def test_a_frozen_gateway_holds_no_poll_past_its_routes_timeout_and_submits_fail_over_or_answer_503(
        cluster: RunningCluster) -> None:
    task_id = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, headers=AUTH,
                         timeout=20).json()["data"]["task_id"]
    wait_status(cluster.lb, task_id, path=f"{API}/", headers=AUTH, timeout=60)
    submits: list[tuple[int, str, float]] = []

    def submit(key: str) -> None:
        started = time.monotonic()
        resp = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, timeout=30,
                          headers=AUTH | {"Idempotency-Key": key})
        submits.append((resp.status_code, resp.headers.get("retry-after", ""), time.monotonic() - started))

    cluster.signal("g1", signal.SIGSTOP)
    try:
        keys = [f"frozen-{time.time_ns()}-{n}" for n in range(2)]
        threads = [threading.Thread(target=submit, args=(key,)) for key in keys]
        for thread in threads:  # one of the two lands on the frozen gateway (round robin)
            thread.start()
        polls: list[tuple[int, float]] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            started = time.monotonic()
            resp = httpx.get(f"{cluster.lb}{API}/{task_id}", headers=AUTH, timeout=30)
            polls.append((resp.status_code, time.monotonic() - started))
        for thread in threads:
            thread.join(40)
    finally:
        cluster.signal("g1", signal.SIGCONT)
    assert {status for status, _ in polls} == {200}, polls
    # a poll that met the frozen gateway waited its location's read timeout (10 s) once, then went to the other;
    # after that the frozen one is left alone, so the rest are quick
    assert max(took for _, took in polls) < 13 and sum(took > 2 for _, took in polls) <= 1, polls
    assert len(polls) >= 5, polls
    # a submit nginx cannot pass on (the frozen gateway has it) is the API's 503 with Retry-After, never a 504
    assert all(status == 202 or (status == 503 and retry_after) for status, retry_after, _ in submits), submits
    assert all(took < 20 for _, _, took in submits), submits
    for key in keys:  # the client's retry with its key gets its task
        again = httpx.post(f"{cluster.lb}{API}", json={"export_type": "report_export"}, timeout=30,
                           headers=AUTH | {"Idempotency-Key": key})
        assert again.status_code == 202, again.text


def test_two_backends_deliver_each_callback_once_though_the_receiver_is_slower_than_their_polls(
        cluster: RunningCluster) -> None:
    # the backends look for due callbacks every 0.2 s; this receiver takes 1.5 s to answer each
    with Receiver(delay_sec=1.5) as receiver:
        body = {"export_type": "report_export", "callback_url": receiver.url}
        ids = []
        for _ in range(8):
            resp = httpx.post(f"{cluster.lb}{API}", json=body, headers=AUTH, timeout=20)
            assert resp.status_code == 202, resp.text
            ids.append(resp.json()["data"]["task_id"])

        def delivered() -> bool:
            states = [httpx.get(f"{cluster.lb}{API}/{task_id}", headers=AUTH, timeout=20).json()["data"]["callback"]
                      for task_id in ids]
            return all(state and state["state"] == "DELIVERED" for state in states)

        # an unclaimed delivery was sent again by the other backend while the receiver still held the first,
        # that is, before the first was recorded as delivered: by now every such repeat has arrived
        wait_until(delivered, 90, interval=0.5, what="every callback to be delivered")
        counts = collections.Counter(r.headers["webhook-id"] for r in receiver.received)
    assert len(counts) == len(ids), counts
    assert [webhook_id for webhook_id, n in counts.items() if n > 1] == [], counts
    assert {json.loads(r.body)["task_id"] for r in receiver.received} == set(ids)
