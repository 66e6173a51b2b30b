"""`make cluster` and compose.yaml: one topology, and a real round trip through the load balancer."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from exports_common.dev_mode import DEMO_API_KEYS
from scripts import run_cluster
from tests.helpers import wait_status
from tests.procs import ROOT, wait_until

# `make cluster` is a local trial in dev mode: the published demo key is what its users type
AUTH = {"Authorization": f"Bearer {DEMO_API_KEYS['demo']}"}


def test_compose_yaml_is_made_from_the_topology_run_cluster_starts() -> None:
    on_disk = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert on_disk == run_cluster.compose(), "stale: python scripts/run_cluster.py compose > compose.yaml"
    services = on_disk["services"]
    assert list(services) == [node.name for node in run_cluster.TOPOLOGY]
    for node in run_cluster.TOPOLOGY:
        service = services[node.name]
        assert service["command"][-3:] == [node.name, "--hosts", "compose"]
        assert service.get("depends_on", []) == list(node.after)
        # every address a node's settings name is a node of the topology, started before it
        for value in node.env.values():
            for named in re.findall(r"\{(\w+)\}", value):
                assert named == "data" or named in node.after or named == "lb", (node.name, named)
    assert services["lb"]["ports"] == [f"{run_cluster.NODES['lb'].port}:{run_cluster.NODES['lb'].port}"]
    kinds = [node.kind for node in run_cluster.TOPOLOGY]
    assert kinds.count("backend") == 2 and kinds.count("gateway") == 2 and kinds.count("lb") == 1


def test_in_compose_nodes_reach_each_other_by_service_name() -> None:
    backend = run_cluster.resolved_env(run_cluster.NODES["b1"], "compose")
    gateway = run_cluster.resolved_env(run_cluster.NODES["g2"], "compose")
    assert backend["REDIS_URL"] == "redis://redis:16379/0" and backend["AWS_ENDPOINT_URL"] == "http://s3:19000"
    assert backend["RESULT_STORE_URL"].startswith("s3://")
    assert gateway["BACKEND_URLS"] == "http://b1:18081,http://b2:18082"
    assert gateway["GATEWAY_PUBLIC_URL"] == backend["GATEWAY_PUBLIC_URL"] == "http://lb:18080"


def _free_offset() -> int:
    """A shift of the topology's ports that leaves every one of them free here."""
    for offset in range(1000, 30000, 997):
        ports = [node.port + offset for node in run_cluster.TOPOLOGY]
        if all(port < 65536 for port in ports) and all(_free(port) for port in ports):
            return offset
    raise AssertionError("no free port range for the cluster")


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no use
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("nginx is not installed (apt-get install nginx-light; .ci/run and make cluster install it)")
    offset = _free_offset()
    env = dict(os.environ, CLUSTER_PORT_OFFSET=str(offset), CLUSTER_DATA_DIR=str(tmp_path))
    log = open(tmp_path / "cluster.log", "wb")
    proc = subprocess.Popen([sys.executable, "scripts/run_cluster.py", "up"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    lb = f"http://127.0.0.1:{run_cluster.NODES['lb'].port + offset}"
    try:
        wait_until(lambda: proc.poll() is None and "Ctrl-C stops them all" in (tmp_path / "cluster.log").read_text(),
                   90, interval=0.3, what=f"the cluster to start; log in {tmp_path}")
        yield lb
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0
    ports = [node.port + offset for node in run_cluster.TOPOLOGY]
    wait_until(lambda: not any(_listening(port) for port in ports), 20, what="every node to stop")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_cluster_serves_a_submit_to_download_round_trip_through_the_load_balancer(cluster: str) -> None:
    resp = httpx.post(f"{cluster}/api/v1/exports", json={"export_type": "report_export"}, headers=AUTH, timeout=10)
    assert resp.status_code == 202, resp.text
    task_id = resp.json()["data"]["task_id"]
    done = wait_status(cluster, task_id, path="/api/v1/exports/", headers=AUTH, timeout=60)
    link = str(done["result"]["download_url"])
    assert link.startswith(f"{cluster}/api/v1/exports/{task_id}/download?"), link
    whole = httpx.get(link, timeout=20)
    part = httpx.get(link, headers={"Range": "bytes=10-19"}, timeout=20)
    assert whole.status_code == 200 and len(whole.content) == done["result"]["bytes"]
    assert part.status_code == 206 and part.content == whole.content[10:20]
