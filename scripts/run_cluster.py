"""`make cluster`: the multi-node topology as real processes on this machine.

Redis, an S3-compatible store (moto in server mode), two backends, two gateways and nginx
balancing the gateways. Every backend reads and writes one `s3://` result store, every gateway
balances over both backends, and links point at the load balancer. Each node is supervised: one
that dies is started again after a backoff, alone, and the output says which; only Ctrl-C (or
SIGTERM) stops them all. Each node's pid is in DATA_DIR/NAME.pid, its log in DATA_DIR/NAME.log.

The topology is described once, in TOPOLOGY below. The same description makes compose.yaml
(`python -m scripts.run_cluster compose > compose.yaml`; a test checks the file is current),
where each container runs `python -m scripts.run_cluster node NAME --hosts compose`.

    python -m scripts.run_cluster up            # all nodes here, until Ctrl-C
    python -m scripts.run_cluster up --store postgresql   # the backends' task store on PostgreSQL
    python -m scripts.run_cluster node g1       # one node (what each container runs)
    python -m scripts.run_cluster check g1      # exit 0 when the node serves (a container's healthcheck)
    python -m scripts.run_cluster compose       # compose.yaml, from the same topology
"""
from __future__ import annotations

import argparse
import json
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
from urllib.parse import quote

import redis
import sqlalchemy as sa
import yaml
from redis import exceptions as redis_errors
from sqlalchemy.engine import make_url

from exports_common import sql
from scripts.supervise import Child, Supervisor, stop_on_sigterm

ROOT = Path(__file__).resolve().parent.parent
# shifts every local port, so a second cluster (a test's) can run beside `make cluster`
PORT_OFFSET = int(os.environ.get("CLUSTER_PORT_OFFSET", "0"))
DATA_DIR = Path(os.environ.get("CLUSTER_DATA_DIR", ROOT / ".data" / "cluster"))
Hosts = Literal["local", "compose"]
BUCKET = "exports"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "cluster-access-key", "AWS_SECRET_ACCESS_KEY": "cluster-secret-key",
                  "AWS_REGION": "us-east-1"}
# Redis always wants a password: without one, Redis 7 refuses every client but loopback ones (protected
# mode), which is every other container. compose.yaml takes it from the environment, required.
LOCAL_REDIS_PASSWORD = "cluster-redis-password"
# The backends answer only the gateways, which send this token (BACKEND_SERVICE_TOKEN, required by compose.yaml)
LOCAL_SERVICE_TOKEN = "cluster-service-token-for-a-local-trial-only"
# moto keeps every object in memory until it is deleted: results expire after an hour (the shortest
# task TTL the contract allows) rather than a day, so a long trial's memory stays bounded
RESULT_TTL_SEC = 3600
LOOPBACK = ["127.0.0.0/8", "::1/128"]
# where nginx connects to the gateways from: here, loopback's first address; in compose, the project's network
# (a private range docker picks); only these may say through X-Forwarded-For who the client is
LB_ADDRESSES: dict[Hosts, list[str]] = {"local": ["127.0.0.1/32"],
                                        "compose": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}
# `up --store postgresql`: the backends' tasks, queue and change log in a database of the cluster's own, made on
# the server of TEST_POSTGRES_URL (the machine's PostgreSQL by default) unless --database-url names another
Store = Literal["redis", "postgresql"]
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
CLUSTER_DATABASE = "exports_cluster"


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
        "REDIS_URL": "redis://:{redis_password}@{redis}/0", "RESULT_STORE_URL": f"s3://{BUCKET}/results",
        "AWS_ENDPOINT_URL": "http://{s3}", **S3_CREDENTIALS, "TASK_TTL_SEC": str(RESULT_TTL_SEC),
        "BACKEND_DATA_DIR": f"{{data}}/{name}", "GATEWAY_PUBLIC_URL": "http://{lb}",
        "BACKEND_SERVICE_TOKEN": "{service_token}", **TRIAL,
    }, after=("redis", "s3"))


def _gateway(name: str, port: int) -> Node:
    return Node(name, "gateway", port, {
        "REDIS_URL": "redis://:{redis_password}@{redis}/0", "GATEWAY_PUBLIC_URL": "http://{lb}",
        "GATEWAY_STATE_DIR": f"{{data}}/{name}", "BACKEND_URLS": "http://{b1},http://{b2}",
        "EXPORT_BACKEND_TOKEN": "{service_token}", **TRIAL,
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


def redis_password(hosts: Hosts) -> str:
    if hosts == "local":
        return os.environ.get("REDIS_PASSWORD") or LOCAL_REDIS_PASSWORD
    password = os.environ.get("REDIS_PASSWORD", "")
    if not password:
        raise SystemExit("REDIS_PASSWORD is not set: compose.yaml passes it to every node")
    return password


def service_token(hosts: Hosts) -> str:
    if hosts == "local":
        return os.environ.get("BACKEND_SERVICE_TOKEN") or LOCAL_SERVICE_TOKEN
    token = os.environ.get("BACKEND_SERVICE_TOKEN", "")
    if not token:
        raise SystemExit("BACKEND_SERVICE_TOKEN is not set: compose.yaml passes it to every node")
    return token


def resolved_env(node: Node, hosts: Hosts) -> dict[str, str]:
    addresses = {name: address(name, hosts) for name in NODES}
    secret = quote(redis_password(hosts), safe="")
    return {key: value.format(data=DATA_DIR, redis_password=secret, service_token=service_token(hosts), **addresses)
            for key, value in node.env.items()}


def _allow_loopback_callbacks(config: dict[str, Any], path: list[str]) -> None:
    """A local trial's receivers listen on this machine: callbacks to loopback are allowed there."""
    for key in path:
        config = config.setdefault(key, {})
    config["allow_networks"] = [*config.get("allow_networks", []), *LOOPBACK]


def _gateway_config(node: Node, env: dict[str, str], hosts: Hosts, workdir: Path) -> Path:
    """config/gateway.yaml with the exports upstream balanced over every backend."""
    config = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    exports = config["upstreams"]["exports"]
    exports.pop("url", None)
    exports["endpoints"] = env["BACKEND_URLS"].split(",")
    exports["balance"] = "least_requests"
    # nginx in front: its X-Forwarded-For names each client, so per-address limits count clients, not nginx
    config["trusted_proxies"] = LB_ADDRESSES[hosts]
    # the callback allow-list is the backend's (below): the gateway's validate learns it from /export-types
    path = workdir / f"{node.name}.gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _backend_config(node: Node, hosts: Hosts, workdir: Path) -> Path:
    config = yaml.safe_load((ROOT / "config" / "backend.yaml").read_text())
    if hosts == "local":
        _allow_loopback_callbacks(config, ["callbacks"])
    path = workdir / f"{node.name}.backend.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _redis_config(hosts: Hosts, workdir: Path, bind: str, node_port: str) -> Path:
    """Its password in a file only its owner reads, not on a command line every user's `ps` shows."""
    path = workdir / "redis.conf"
    path.touch(mode=0o600)
    path.write_text("\n".join([
        f"port {node_port}", f"bind {bind}", 'save ""', "appendonly yes", "appendfsync everysec",
        f"dir {workdir}", f"requirepass {json.dumps(redis_password(hosts))}", ""]))
    return path


def nginx_config(env: dict[str, str], workdir: Path, listen: str) -> Path:
    template = Template((ROOT / "deploy" / "nginx.conf.template").read_text())
    # a gateway that failed a request (connect error, or no answer within its location's read timeout)
    # is left alone for fail_timeout; the request itself goes on to the other gateway where it may
    servers = "".join(f"        server {g} max_fails=1 fail_timeout=10s;\n" for g in env["GATEWAYS"].split(","))
    path = workdir / "nginx.conf"
    path.write_text(template.substitute(listen=listen, servers=servers, workdir=workdir))
    return path


def command(node: Node, hosts: Hosts, workdir: Path) -> list[str]:
    """What runs the node (config files it needs are written into workdir)."""
    bind = "127.0.0.1" if hosts == "local" else "0.0.0.0"
    env = resolved_env(node, hosts)
    node_port = str(port(node.name, hosts))
    if node.kind == "redis":
        return ["redis-server", str(_redis_config(hosts, workdir, bind, node_port))]
    if node.kind == "s3":
        return [sys.executable, "-m", "moto.server", "-H", bind, "-p", node_port]
    if node.kind == "backend":
        return [sys.executable, "-m", "backend_stub", "run", "--config", str(_backend_config(node, hosts, workdir)),
                "--host", bind, "--port", node_port]
    if node.kind == "gateway":
        return [sys.executable, "-m", "gateway", "run", "--config", str(_gateway_config(node, env, hosts, workdir)),
                "--host", bind, "--port", node_port]
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return [nginx, "-e", "stderr", "-p", str(workdir), "-c", str(nginx_config(env, workdir, f"{bind}:{node_port}"))]


def ready(node: Node, hosts: Hosts) -> bool:
    """Whether the node serves: Redis answers PING (with its password), S3 its API, the others /healthz."""
    if node.kind == "redis":
        url = f"redis://:{quote(redis_password(hosts), safe='')}@{address(node.name, hosts)}/0"
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
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
            if ready(node, hosts):
                return
        except (OSError, redis_errors.RedisError):  # not up yet (a restarting Redis answers LOADING)
            pass
        time.sleep(0.2)
    raise SystemExit(f"{node.name} did not become ready within {timeout:.0f} s")


def make_bucket(hosts: Hosts) -> None:
    """The result store's bucket exists beforehand (moto accepts this unsigned create; again is no error)."""
    request = urllib.request.Request(f"http://{address('s3', hosts)}/{BUCKET}", method="PUT")
    urllib.request.urlopen(request, timeout=30).close()  # moto answers slowly on a loaded machine


def default_database_url() -> str:
    """The cluster's own database on TEST_POSTGRES_URL's server."""
    server = make_url(os.environ.get("TEST_POSTGRES_URL") or DEFAULT_POSTGRES)
    return server.set(database=CLUSTER_DATABASE).render_as_string(hide_password=False)


def create_database(url: str) -> None:
    """Create the database `url` names, on its server, unless it exists (the backends make its tables)."""
    target = make_url(url)
    name = target.database or CLUSTER_DATABASE
    server = target.set(database="postgres")
    engine = sql.make_engine(server, sql.EngineSettings(pool_size=1, connect_timeout=5))
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            found = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}).first()
            if found is None:
                conn.execute(sa.text(f"CREATE DATABASE {engine.dialect.identifier_preparer.quote(name)}"))
    except sa.exc.SQLAlchemyError as exc:
        raise SystemExit(f"{sql.sql_error(exc, server).message} (make cluster STORE=postgresql makes its database "
                         "there; CLUSTER_DATABASE_URL=postgresql://... names another)") from None
    finally:
        engine.dispose()


def store_env(store: Store, database_url: str) -> dict[str, str]:
    """What the backends need besides their node's settings to hold their tasks in `store`."""
    return {"BACKEND_DATABASE_URL": database_url, "BACKEND_STORE": "sql"} if store == "postgresql" else {}


def start_node(node: Node, hosts: Hosts, workdir: Path, log: Any = None,
               extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    node_dir = workdir / node.name
    node_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **resolved_env(node, hosts))
    if node.kind == "backend":
        env.update(extra or {})
    return subprocess.Popen(command(node, hosts, node_dir), cwd=ROOT, env=env, stdout=log, stderr=log)


def _local_child(node: Node, workdir: Path, backend_env: dict[str, str]) -> Child:
    """A node of `make cluster`: appends to NAME.log, writes its pid to NAME.pid at every start."""

    def start() -> subprocess.Popen[bytes]:
        with open(workdir / f"{node.name}.log", "ab") as log:
            proc = start_node(node, "local", workdir, log, backend_env)
        (workdir / f"{node.name}.pid").write_text(f"{proc.pid}\n")
        return proc

    # moto keeps nothing across a restart: its bucket is made again (the objects in it are gone)
    after = (lambda: make_bucket("local")) if node.kind == "s3" else None
    return Child(node.name, start, lambda: ready(node, "local"), after)


def _say(line: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {line}", flush=True)


def up(workdir: Path, on_ready: Any = None, store: Store = "redis", database_url: str = "") -> int:
    """Start every node in order, each once the ones before it answer; then keep each running until Ctrl-C
    or SIGTERM, which stop them all."""
    workdir.mkdir(parents=True, exist_ok=True)
    database_url = database_url or default_database_url()
    if store == "postgresql":
        create_database(database_url)
    supervisor = Supervisor(_say)
    stop_on_sigterm()
    try:
        for node in TOPOLOGY:
            child = _local_child(node, workdir, store_env(store, database_url))
            proc = child.start()
            supervisor.adopt(child, proc)
            wait_ready(node, "local", proc)
            if child.on_ready is not None:
                child.on_ready()
        print(banner(store, database_url), flush=True)
        if on_ready is not None:
            on_ready()
        supervisor.run()
    except KeyboardInterrupt:
        pass
    finally:
        supervisor.stop()
    return 0


def banner(store: Store = "redis", database_url: str = "") -> str:
    lb = f"http://{address('lb', 'local')}"
    tasks = (f"PostgreSQL, database {make_url(database_url).render_as_string()}" if store == "postgresql"
             else f"Redis at {address('redis', 'local')}")
    lines = [f"  {n.name:6} {n.kind:8} {'redis' if n.kind == 'redis' else 'http'}://{address(n.name, 'local')}"
             for n in TOPOLOGY]
    return "\n".join([
        "", f"Export cluster is up (logs under {DATA_DIR}):", *lines, "",
        f"  public URL (load balancer): {lb}/api/v1/exports",
        "  DEV MODE (a local trial): the published demo keys and secrets are accepted; never expose it",
        "  demo API keys:  demo -> demo-key-change-me    demo2 -> demo2-key-change-me",
        f"  admin token:    {os.environ.get('GATEWAY_ADMIN_TOKEN', 'admin-change-me')} (on each gateway)",
        f"  result store:   s3://{BUCKET}/results at http://{address('s3', 'local')} (results kept "
        f"{RESULT_TTL_SEC // 3600} h: moto holds every object in memory)",
        f"  task store:     {tasks} (the gateways' shared state is on Redis)",
        "  callbacks:      receivers on this machine (127.0.0.1) are allowed, as in any local trial",
        "", f"Try: curl -s -X POST {lb}/api/v1/exports -H 'Authorization: Bearer demo-key-change-me' "
        "-H 'Content-Type: application/json' -d '{\"export_type\": \"report_export\"}'",
        "", "A node that dies is started again after a backoff (1 s, doubling to 30 s); lines starting",
        "[cluster] name it. Its pid is in NAME.pid beside its log. Ctrl-C stops them all.", ""])


REDIS_VOLUME = "redis-data"
HEALTHCHECK = {"interval": "5s", "timeout": "3s", "retries": 5, "start_period": "60s"}


def compose() -> dict[str, Any]:
    """compose.yaml: one service per node, all from the project's image, each running its node.

    Each is restarted when it dies and checked by the same readiness test `make cluster` waits on;
    a node starts once the nodes it needs are healthy. Redis wants REDIS_PASSWORD (compose refuses to
    start without it) and keeps its append-only file in a volume.
    """
    services: dict[str, Any] = {}
    for node in TOPOLOGY:
        service: dict[str, Any] = {
            "build": ".", "image": "export-gateway:local",
            "command": ["python", "-m", "scripts.run_cluster", "node", node.name, "--hosts", "compose"],
            "environment": {
                "REDIS_PASSWORD": "${REDIS_PASSWORD:?set REDIS_PASSWORD to a long random string}",
                "BACKEND_SERVICE_TOKEN": "${BACKEND_SERVICE_TOKEN:?set it to 32+ random characters}"},
            "restart": "unless-stopped",
            "healthcheck": {"test": ["CMD", "python", "-m", "scripts.run_cluster", "check", node.name, "--hosts",
                                     "compose"], **HEALTHCHECK},
        }
        if node.after:
            service["depends_on"] = {name: {"condition": "service_healthy"} for name in node.after}
        if node.kind == "redis":
            service["volumes"] = [f"{REDIS_VOLUME}:/app/.data/cluster/{node.name}"]
        if node.kind == "lb":
            service["ports"] = [f"{node.port}:{node.port}"]
        services[node.name] = service
    return {"name": "export-gateway", "services": services, "volumes": {REDIS_VOLUME: {}}}


def check(name: str, hosts: Hosts) -> int:
    """0 when the node serves, 1 otherwise (a container's healthcheck)."""
    try:
        return 0 if ready(NODES[name], hosts) else 1
    except (OSError, redis_errors.RedisError) as exc:
        print(f"{name} does not serve: {exc}", file=sys.stderr)
        return 1


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
    start = sub.add_parser("up", help="start every node here until Ctrl-C")
    start.add_argument("--store", choices=["redis", "postgresql"], default="redis",
                       help="where the backends keep tasks, the queue and the change log")
    start.add_argument("--database-url", default="", help=(
        f"--store postgresql: the database (made if missing); default: {CLUSTER_DATABASE} on TEST_POSTGRES_URL's "
        "server"))
    one = sub.add_parser("node", help="run one node in the foreground")
    one.add_argument("name", choices=list(NODES))
    one.add_argument("--hosts", choices=["local", "compose"], default="local")
    probe = sub.add_parser("check", help="exit 0 when the node serves")
    probe.add_argument("name", choices=list(NODES))
    probe.add_argument("--hosts", choices=["local", "compose"], default="local")
    sub.add_parser("compose", help="print compose.yaml")
    args = parser.parse_args()
    if args.what == "compose":
        print("# Made by `python -m scripts.run_cluster compose > compose.yaml` from its TOPOLOGY; do not edit.")
        print(yaml.safe_dump(compose(), sort_keys=False), end="")
        return 0
    if args.what == "node":
        return node_main(args.name, args.hosts)
    if args.what == "check":
        return check(args.name, args.hosts)
    return up(DATA_DIR, store=args.store, database_url=args.database_url)


if __name__ == "__main__":
    sys.exit(main())
