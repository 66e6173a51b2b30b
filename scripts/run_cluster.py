"""`make cluster`: the multi-node topology as real processes on this machine.

Redis, an S3-compatible store (moto in server mode), two backends, two gateways and nginx
balancing the gateways. Every backend reads and writes one `s3://` result store, every gateway
balances over both backends, and links point at the load balancer. Ctrl-C stops them all.

The topology is described once, in TOPOLOGY below. The same description makes compose.yaml
(`python scripts/run_cluster.py compose > compose.yaml`; a test checks the file is current),
where each container runs `python scripts/run_cluster.py node NAME --hosts compose`.

    python scripts/run_cluster.py up            # all nodes here, until Ctrl-C
    python scripts/run_cluster.py node g1       # one node (what each container runs)
    python scripts/run_cluster.py compose       # compose.yaml, from the same topology
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Literal

import redis
import yaml
from redis import exceptions as redis_errors

from exports_common.supervise import stop_all, stop_on_sigterm, wait_for_any_exit

ROOT = Path(__file__).resolve().parent.parent
# shifts every local port, so a second cluster (a test's) can run beside `make cluster`
PORT_OFFSET = int(os.environ.get("CLUSTER_PORT_OFFSET", "0"))
DATA_DIR = Path(os.environ.get("CLUSTER_DATA_DIR", ROOT / ".data" / "cluster"))
Hosts = Literal["local", "compose"]
BUCKET = "exports"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "cluster-access-key", "AWS_SECRET_ACCESS_KEY": "cluster-secret-key",
                  "AWS_REGION": "us-east-1"}


@dataclass(frozen=True)
class Node:
    name: str
    kind: Literal["redis", "s3", "backend", "gateway", "lb"]
    port: int
    # values may name another node as {name}: its host:port, as this machine or a container sees it
    env: dict[str, str] = field(default_factory=dict)
    after: tuple[str, ...] = ()


# a local trial with the published demo keys, as `make run` is: both processes refuse them outside dev mode
TRIAL = {"EXPORTS_DEV": "1"}


def _backend(name: str, port: int) -> Node:
    return Node(name, "backend", port, {
        "REDIS_URL": "redis://{redis}/0", "RESULT_STORE_URL": f"s3://{BUCKET}/results",
        "AWS_ENDPOINT_URL": "http://{s3}", **S3_CREDENTIALS,
        "BACKEND_DATA_DIR": f"{{data}}/{name}", "GATEWAY_PUBLIC_URL": "http://{lb}", **TRIAL,
    }, after=("redis", "s3"))


def _gateway(name: str, port: int) -> Node:
    return Node(name, "gateway", port, {
        "REDIS_URL": "redis://{redis}/0", "GATEWAY_PUBLIC_URL": "http://{lb}",
        "GATEWAY_STATE_DIR": f"{{data}}/{name}", "BACKEND_URLS": "http://{b1},http://{b2}", **TRIAL,
    }, after=("redis", "b1", "b2"))


TOPOLOGY: tuple[Node, ...] = (
    Node("redis", "redis", 16379),
    Node("s3", "s3", 19000),
    _backend("b1", 18081),
    _backend("b2", 18082),
    _gateway("g1", 18091),
    _gateway("g2", 18092),
    Node("lb", "lb", 18080, {"GATEWAYS": "{g1},{g2}"}, after=("g1", "g2")),
)
NODES = {node.name: node for node in TOPOLOGY}


def port(name: str, hosts: Hosts) -> int:
    return NODES[name].port + (PORT_OFFSET if hosts == "local" else 0)


def address(name: str, hosts: Hosts) -> str:
    return f"{'127.0.0.1' if hosts == 'local' else name}:{port(name, hosts)}"


def resolved_env(node: Node, hosts: Hosts) -> dict[str, str]:
    addresses = {name: address(name, hosts) for name in NODES}
    return {key: value.format(data=DATA_DIR, **addresses) for key, value in node.env.items()}


def _gateway_config(node: Node, env: dict[str, str], workdir: Path) -> Path:
    """config/gateway.yaml with the exports upstream balanced over every backend."""
    config = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    exports = config["upstreams"]["exports"]
    exports.pop("url", None)
    exports["endpoints"] = env["BACKEND_URLS"].split(",")
    exports["balance"] = "least_requests"
    path = workdir / f"{node.name}.gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _nginx_config(env: dict[str, str], workdir: Path, listen: str) -> Path:
    template = Template((ROOT / "deploy" / "nginx.conf.template").read_text())
    servers = "".join(f"        server {g} max_fails=2 fail_timeout=5s;\n" for g in env["GATEWAYS"].split(","))
    path = workdir / "nginx.conf"
    path.write_text(template.substitute(listen=listen, servers=servers, workdir=workdir))
    return path


def command(node: Node, hosts: Hosts, workdir: Path) -> list[str]:
    """What runs the node (config files it needs are written into workdir)."""
    bind = "127.0.0.1" if hosts == "local" else "0.0.0.0"
    env = resolved_env(node, hosts)
    node_port = str(port(node.name, hosts))
    if node.kind == "redis":
        return ["redis-server", "--port", node_port, "--bind", bind, "--save", "", "--appendonly", "yes",
                "--dir", str(workdir)]
    if node.kind == "s3":
        return [sys.executable, "-m", "moto.server", "-H", bind, "-p", node_port]
    if node.kind == "backend":
        return [sys.executable, "-m", "backend_stub", "run", "--config", "config/backend.yaml",
                "--host", bind, "--port", node_port]
    if node.kind == "gateway":
        return [sys.executable, "-m", "gateway", "run", "--config", str(_gateway_config(node, env, workdir)),
                "--host", bind, "--port", node_port]
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return [nginx, "-e", "stderr", "-p", str(workdir), "-c", str(_nginx_config(env, workdir, f"{bind}:{node_port}"))]


def _ready(node: Node, hosts: Hosts) -> bool:
    if node.kind == "redis":
        client = redis.Redis.from_url(f"redis://{address(node.name, hosts)}/0")
        try:
            return bool(client.ping())
        finally:
            client.close()
    path = {"s3": "/moto-api/", "lb": "/healthz"}.get(node.kind, "/healthz")
    with urllib.request.urlopen(f"http://{address(node.name, hosts)}{path}", timeout=1) as resp:
        return bool(resp.status == 200)


def wait_ready(node: Node, hosts: Hosts, proc: subprocess.Popen[bytes] | None, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{node.name}: exited with {proc.returncode}; see its log")
        try:
            if _ready(node, hosts):
                return
        except (OSError, redis_errors.ConnectionError):  # not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"{node.name} did not become ready within {timeout:.0f} s")


def make_bucket(hosts: Hosts) -> None:
    """The result store's bucket exists beforehand (moto accepts this unsigned create)."""
    request = urllib.request.Request(f"http://{address('s3', hosts)}/{BUCKET}", method="PUT")
    urllib.request.urlopen(request, timeout=5).close()


def start_node(node: Node, hosts: Hosts, workdir: Path, log: Any = None) -> subprocess.Popen[bytes]:
    node_dir = workdir / node.name
    node_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **resolved_env(node, hosts))
    return subprocess.Popen(command(node, hosts, node_dir), cwd=ROOT, env=env, stdout=log, stderr=log)


def up(workdir: Path, on_ready: Any = None) -> int:
    """Start every node in order, each once the ones before it answer; stop all on Ctrl-C or SIGTERM."""
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    stop_on_sigterm()
    try:
        for node in TOPOLOGY:
            with open(workdir / f"{node.name}.log", "ab") as log:
                proc = start_node(node, "local", workdir, log)
            started.append(proc)
            wait_ready(node, "local", proc)
            if node.kind == "s3":
                make_bucket("local")
        print(banner(), flush=True)
        if on_ready is not None:
            on_ready()
        wait_for_any_exit(started)
        print("a node exited; stopping the cluster (logs in " + str(workdir) + ")", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(started)
    return 0


def banner() -> str:
    lb = f"http://{address('lb', 'local')}"
    lines = [f"  {n.name:6} {n.kind:8} {'redis' if n.kind == 'redis' else 'http'}://{address(n.name, 'local')}"
             for n in TOPOLOGY]
    return "\n".join([
        "", f"Export cluster is up (logs under {DATA_DIR}):", *lines, "",
        f"  public URL (load balancer): {lb}/api/v1/exports",
        "  DEV MODE (a local trial): the published demo keys and secrets are accepted; never expose it",
        "  demo API keys:  demo -> demo-key-change-me    demo2 -> demo2-key-change-me",
        f"  admin token:    {os.environ.get('GATEWAY_ADMIN_TOKEN', 'admin-change-me')} (on each gateway)",
        f"  result store:   s3://{BUCKET}/results at http://{address('s3', 'local')}",
        "", f"Try: curl -s -X POST {lb}/api/v1/exports -H 'Authorization: Bearer demo-key-change-me' "
        "-H 'Content-Type: application/json' -d '{\"export_type\": \"report_export\"}'",
        "Ctrl-C stops them all.", ""])


def compose() -> dict[str, Any]:
    """compose.yaml: one service per node, all from the project's image, each running its node."""
    services: dict[str, Any] = {}
    for node in TOPOLOGY:
        service: dict[str, Any] = {
            "build": ".", "image": "export-gateway:local",
            "command": ["python", "scripts/run_cluster.py", "node", node.name, "--hosts", "compose"],
        }
        if node.after:
            service["depends_on"] = list(node.after)
        if node.kind == "lb":
            service["ports"] = [f"{node.port}:{node.port}"]
        services[node.name] = service
    return {"name": "export-gateway", "services": services}


def node_main(name: str, hosts: Hosts) -> int:
    """Run one node in the foreground (a container's process), once the nodes it needs answer."""
    node = NODES[name]
    for before in node.after:
        wait_ready(NODES[before], hosts, None, timeout=120)
    workdir = DATA_DIR / name
    workdir.mkdir(parents=True, exist_ok=True)
    if node.kind == "s3":
        proc = start_node(node, hosts, DATA_DIR)
        wait_ready(node, hosts, proc)
        make_bucket(hosts)
        return proc.wait()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **resolved_env(node, hosts))
    os.chdir(ROOT)
    os.execvpe(command(node, hosts, workdir)[0], command(node, hosts, workdir), env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("up", help="start every node here until Ctrl-C")
    one = sub.add_parser("node", help="run one node in the foreground")
    one.add_argument("name", choices=list(NODES))
    one.add_argument("--hosts", choices=["local", "compose"], default="local")
    sub.add_parser("compose", help="print compose.yaml")
    args = parser.parse_args()
    if args.what == "compose":
        print("# Made by `python scripts/run_cluster.py compose > compose.yaml` from its TOPOLOGY; do not edit.")
        print(yaml.safe_dump(compose(), sort_keys=False), end="")
        return 0
    if args.what == "node":
        return node_main(args.name, args.hosts)
    return up(DATA_DIR)


if __name__ == "__main__":
    sys.exit(main())
