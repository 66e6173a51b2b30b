"""Real processes for the tests: the backend, the gateway and Redis, on free loopback ports."""
from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
# The backend answers only callers with its service token. Every process started here gets it from the
# environment: a backend as BACKEND_SERVICE_TOKEN, a gateway's upstreams as EXPORT_BACKEND_TOKEN.
SERVICE_TOKEN = secrets.token_urlsafe(32)
SERVICE_TOKEN_ENV = {"BACKEND_SERVICE_TOKEN": SERVICE_TOKEN, "EXPORT_BACKEND_TOKEN": SERVICE_TOKEN}


def backend_headers(tenant: str | None = None, **extra: str) -> dict[str, str]:
    """What a test calling a backend directly sends, as a gateway would: the service token and the tenant."""
    headers = {"Authorization": f"Bearer {SERVICE_TOKEN}", **extra}
    if tenant is not None:
        headers["X-Tenant-Id"] = tenant
    return headers


# Under pytest-xdist each worker hands out ports from a block of its own, below the kernel's ephemeral range
# (where outgoing connections and port-0 binds take theirs): a port given to one worker's server is never
# given to another worker's before that server has bound it.
_BLOCK_START, _BLOCK_SIZE = 20_000, 1_000
_handed = itertools.count(random.randrange(_BLOCK_SIZE))


def free_port() -> int:
    """A loopback port free now, and not handed out earlier in this process (until its block wraps)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    base = _BLOCK_START + int(worker[2:]) * _BLOCK_SIZE
    for _ in range(_BLOCK_SIZE):
        port = base + next(_handed) % _BLOCK_SIZE
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no use
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + _BLOCK_SIZE - 1} for xdist worker {worker}")


def wait_until(check: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - the thing polled may not be up yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_error})")


@contextlib.contextmanager
def stand_in(command: list[str], port: int, what: str, ready_path: str = "/healthz",
             env: dict[str, str] | None = None, log: Path | None = None, timeout: float = 20.0) -> Iterator[str]:
    """A test's stand-in server, `command` listening on `port` (run from the project root, its output to `log`
    or nowhere): its URL once `ready_path` answers 200 (within `timeout` seconds), the process stopped at the end."""
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as out:
        # a session of its own: a server with worker processes (granian) is killed whole if it will not stop
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}{ready_path}", timeout=1).status_code == 200, timeout, what=what)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # granian now and then ignores SIGTERM
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def uvicorn_command(app: str, port: int) -> list[str]:
    """uvicorn serving the ASGI app `app` ("module:attribute") on loopback at `port`."""
    return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_default(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "config" / name).read_text())


class Service:
    """One server process; `url` once it answers on /healthz."""

    def __init__(self, module: str, config: dict[str, Any], workdir: Path, name: str,
                 env: dict[str, str] | None = None, root: Path = ROOT, args: tuple[str, ...] = ()) -> None:
        self.module = module
        self.args = args  # after `run --config FILE`, e.g. ("--workers", "2")
        # another checkout (a benchmark's "before"): its own code, run by its own virtualenv
        self.root = root
        self.python = str(root / ".venv" / "bin" / "python") if root != ROOT else sys.executable
        self.config = config
        self.workdir = workdir
        self.name = name
        # a config may name its port in advance (a gateway whose public URL names it); 0 picks a free one
        self.port = int(config.get("port") or 0) or free_port()
        self.config["port"] = self.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **SERVICE_TOKEN_ENV) | (env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def start(self, timeout: float = 20.0) -> Service:
        self.write_config()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", self.module, "run", "--config", str(self.config_path), *self.args],
            cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        if "--workers" in self.args:  # each worker is a new interpreter (uvicorn spawns them) importing the app anew
            timeout *= 3
        try:
            wait_until(self._healthy, timeout, what=f"{self.name} to answer on {self.url}/healthz")
        except BaseException:  # a server that never answered is stopped here: no fixture will stop it
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log:\n{self.log()[-3000:]}")
        return httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


class RedisServer:
    """A private redis-server on a free port, so tests never touch a shared one.

    `persistent` runs it with an append-only file (fsync every second), as docs/operations/several-nodes.md
    tells operators to; `restart` then brings the data back, and `restart(empty=True)`
    is a server that lost everything.
    """

    def __init__(self, workdir: Path, persistent: bool = False, fsync: str = "everysec") -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.persistent = persistent
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        persistence = ["--appendonly", "yes", "--appendfsync", self.fsync] if self.persistent else \
            ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence,
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self.ping, 10, what="redis-server to answer")
        return self

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)

    def ping(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        finally:
            client.close()

    def flush(self) -> None:
        client = self.client()
        client.flushall()
        client.close()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and commands sit unanswered, as on a stalled host."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, empty: bool = False) -> RedisServer:
        """kill -9, then start again on the same port: with its append-only file unless `empty`."""
        self.kill()
        if empty:
            shutil.rmtree(self.workdir / "appendonlydir", ignore_errors=True)
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(10)


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher, at most 65,535) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1]) % 40_000 + 15_000
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisClusterServers:
    """A private Redis Cluster: `size` primaries in cluster mode, every slot assigned, each with `replicas` replicas.

    `url` is what the processes are given (`redis+cluster://` and one node: the client
    finds the others). Started and joined in about a second. With replicas, a node is
    judged failed after `node_timeout_ms` (1 s here, 15 s by Redis's default) and its
    replica is promoted: `kill` a primary, then `wait_failover`.
    """

    def __init__(self, workdir: Path, size: int = 3, replicas: int = 0, node_timeout_ms: int = 1000) -> None:
        self.workdir = workdir
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports = [_cluster_port() for _ in range(size * (1 + replicas))]
        self.url = f"redis+cluster://127.0.0.1:{self.ports[0]}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        # the node's identity and slots live in its nodes-<port>.conf: a restarted node takes them back
        timeout = ["--cluster-node-timeout", str(self.node_timeout_ms)] if self.replicas else []
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", f"nodes-{port}.conf", "--appendonly", "no", "--save", "",
             "--dir", str(self.workdir), *timeout],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(functools.partial(self._ask, port, "ping"), 10, what=f"redis-server :{port} to answer")
        return proc

    def start(self) -> RedisClusterServers:
        self.procs = [self._spawn(port) for port in self.ports]
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=30)
        wait_until(self._ok, 15, what="every node to report cluster_state:ok")
        if self.replicas:  # and every replica has synced with its primary, so a failover loses nothing
            wait_until(self._replicas_synced, 15, what="every replica to sync with its primary")
        return self

    def _live_ports(self) -> list[int]:
        return [port for port, proc in zip(self.ports, self.procs, strict=True) if proc.poll() is None]

    def _ok(self) -> bool:
        return all(self._ask(port, "cluster", "info")["cluster_state"] == "ok" for port in self._live_ports())

    def _replicas_synced(self) -> bool:
        for port in self._live_ports():
            info = self._ask(port, "info", "replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def primaries(self) -> list[int]:
        return [port for port in self._live_ports() if self._ask(port, "info", "replication")["role"] == "master"]

    def wait_failover(self, key: str, dead: int, timeout: float = 30.0) -> int:
        """Wait until a live node serves `key`'s slot (its replica was promoted) and the cluster is ok; its port."""
        def promoted() -> int | None:
            owner = self.owner(key)
            return owner if owner != dead and self._ok() else None

        return int(wait_until(promoted, timeout, interval=0.1, what=f"a replica to take over {key}'s slot"))

    def _ask(self, port: int, command: str, *args: Any) -> Any:
        """One command to one node, on a plain connection (a node answers for its own slots only)."""
        import redis

        with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as client:
            return getattr(client, command)(*args)

    def owner(self, key: str) -> int:
        """The port of the node serving `key`'s slot."""
        import redis

        for port in self._live_ports():
            try:
                self._ask(port, "exists", key)
                return port
            except (redis.ResponseError, redis.ConnectionError):  # MOVED: another node serves it (or none yet)
                continue
        raise LookupError(f"no node serves {key}")

    def kill(self, port: int) -> None:
        """kill -9 one node (it had no persistence: it comes back empty)."""
        proc = self.procs[self.ports.index(port)]
        proc.kill()
        proc.wait(10)

    def restart(self, port: int) -> None:
        self.procs[self.ports.index(port)] = self._spawn(port)
        wait_until(self._ok, 30, what="the cluster to be whole again")

    def keys(self) -> dict[int, list[str]]:
        """Every primary's keys, by port."""
        return {port: sorted(self._ask(port, "keys", "*")) for port in self.primaries()}

    def slot(self, key: str) -> int:
        return int(self._ask(self.ports[0], "cluster", "keyslot", key))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class S3Server:
    """A private S3-compatible server (moto in server mode) on a free port, with one bucket made beforehand."""

    ACCESS_KEY = "testing-access-key"
    SECRET_KEY = "testing-secret-key"
    REGION = "us-east-1"

    def __init__(self, workdir: Path, bucket: str = "exports") -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.log_path = workdir / f"moto-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables a backend reads to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY, "AWS_REGION": self.REGION}

    def start(self, make_bucket: bool = True) -> S3Server:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: httpx.get(f"{self.endpoint}/moto-api/", timeout=1.0).status_code == 200, 30,
                   what="moto server to answer")
        if make_bucket:
            httpx.put(f"{self.endpoint}/{self.bucket}", timeout=5.0).raise_for_status()
        return self

    def object_keys(self) -> list[str]:
        """Every object key in the bucket (a plain unsigned ListObjectsV2, which moto accepts)."""
        body = httpx.get(f"{self.endpoint}/{self.bucket}?list-type=2", timeout=5.0).text
        import re

        return re.findall(r"<Key>([^<]+)</Key>", body)

    def delete(self, key: str) -> None:
        """Remove one object behind the backends' backs (moto refuses unsigned deletes)."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(self.bucket, endpoint=self.endpoint, access_key_id=self.ACCESS_KEY,
                        secret_access_key=self.SECRET_KEY, region=self.REGION, client_options={"allow_http": True})
        obstore.delete(store, key)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
