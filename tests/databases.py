"""Real SQL databases for the tests: one of its own per test on the machine's servers, and private servers.

The machine's servers are read from `TEST_POSTGRES_URL` and `TEST_MARIADB_URL` (defaults below;
`scripts/ensure_test_services.sh`, which `make test` runs, installs and starts them). A test gets a
database of its own, created and dropped around it, under a unique name; one that finds its server
unreachable FAILS, naming the variable and what to run. It never skips.

A test that restarts, kills or pauses a server starts a private one (`PostgresInstance`,
`MariaDBInstance`) on a free port in a temporary directory: never the machine's. Each is a copy of
a data directory initialised once per session, so that it starts in a fraction of a second. Its
processes die with the test process even when that is killed (parent-death signal).
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Self

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from exports_common import sql
from tests.procs import free_port, wait_until


@dataclass(frozen=True)
class SqlDatabase:
    """A database of one test's own: `url` as a user writes it (postgresql://..., mysql://...)."""

    kind: str  # "postgresql" | "mariadb"
    name: str
    url: str


@dataclass(frozen=True)
class SqlServer:
    """One of the machine's servers, as the tests reach it."""

    kind: str
    variable: str
    default: str
    start_hint: str

    @property
    def url(self) -> str:
        return os.environ.get(self.variable) or self.default


POSTGRES = SqlServer("postgresql", "TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test",
                     "PostgreSQL (127.0.0.1:5432, user postgres without a password, database test)")
MARIADB = SqlServer("mariadb", "TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/test",
                    "MariaDB (127.0.0.1:3306, user root without a password, database test)")
SERVERS = {server.kind: server for server in (POSTGRES, MARIADB)}

_admin_engines: dict[str, Engine] = {}
_unreachable: dict[str, str] = {}


def admin_engine(server: SqlServer) -> Engine:
    """An autocommit engine on the server's own database (from its variable), for CREATE/DROP DATABASE.

    Fails the calling test, naming the variable and what to run, when the server is unreachable.
    """
    if server.url not in _admin_engines and server.url not in _unreachable:
        engine = sql.make_engine(server.url, sql.EngineSettings(pool_size=1, max_overflow=1, connect_timeout=3))
        try:
            sql.server_version(engine)
            _admin_engines[server.url] = engine.execution_options(isolation_level="AUTOCOMMIT")
        except sql.SqlError as error:
            engine.dispose()
            _unreachable[server.url] = (  # once per session: the next tests fail at once
                f"{server.variable}: {error.message}. The tests use {server.variable}, by default "
                f"{server.start_hint}: run scripts/ensure_test_services.sh (make test runs it) to install and "
                f"start it, or set {server.variable} to a server where this user may create and drop databases")
        else:
            _drop_leftovers(server)
    if server.url in _unreachable:
        pytest.fail(_unreachable[server.url], pytrace=False)
    return _admin_engines[server.url]


def _unique_name(label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")[:24]
    return f"pytest_{os.getpid()}_{secrets.token_hex(3)}_{slug}".rstrip("_")


def _drop(server: SqlServer, name: str) -> None:
    quoted = admin_engine(server).dialect.identifier_preparer.quote(name)
    with admin_engine(server).connect() as conn:
        if server.kind == "postgresql":
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
            return
        # MariaDB has no FORCE: end the sessions still in it, and bound the wait on others' table locks
        sessions = conn.execute(sa.text("SELECT id FROM information_schema.processlist WHERE db = :name "
                                        "AND id <> CONNECTION_ID()"), {"name": name}).scalars().all()
        for session in sessions:
            with contextlib.suppress(sa.exc.DBAPIError):  # it may have ended meanwhile
                conn.execute(sa.text(f"KILL CONNECTION {int(session)}"))
        conn.execute(sa.text("SET SESSION lock_wait_timeout = 20"))
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {quoted}"))


def _drop_leftovers(server: SqlServer) -> None:
    """Drop the databases of test processes that died before dropping theirs (their pid is gone)."""
    if make_url(server.url).host not in ("127.0.0.1", "localhost", "::1"):
        return  # another machine's processes: their pids say nothing here
    query = ("SELECT datname FROM pg_database WHERE datname LIKE 'pytest\\_%'" if server.kind == "postgresql"
             else "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'pytest\\_%'")
    with _admin_engines[server.url].connect() as conn:
        names = conn.execute(sa.text(query)).scalars().all()
    for name in names:
        pid = int(name.split("_")[1]) if name.split("_")[1].isdigit() else 0
        if pid and not Path(f"/proc/{pid}").exists():
            _drop(server, name)


@contextlib.contextmanager
def scratch_database(server: SqlServer, label: str = "") -> Iterator[SqlDatabase]:
    """A new, empty database on the server, dropped on exit (its open sessions ended)."""
    engine = admin_engine(server)
    name = _unique_name(label)
    quoted = engine.dialect.identifier_preparer.quote(name)
    with engine.connect() as conn:
        suffix = " CHARACTER SET utf8mb4" if server.kind == "mariadb" else ""  # whatever the server's default
        conn.execute(sa.text(f"CREATE DATABASE {quoted}{suffix}"))
    url = make_url(server.url).set(database=name).render_as_string(hide_password=False)
    try:
        yield SqlDatabase(server.kind, name, url)
    finally:
        _drop(server, name)


# ---------------------------------------------------------------------------------------------------
# private servers


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def server_home(label: str) -> Path:
    """A new directory for a private server's files: in memory (/dev/shm) where there is one, so that copying
    a data directory and writing to it wait on no disk shared with the rest of the machine."""
    memory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"pytest-{label}-", dir=memory))


def _alive(pid: int) -> bool:
    """Not yet exited (a zombie, which only waits for its parent to reap it, has exited)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


class _Instance:
    """What both private servers share: a home directory (data, log, socket), a process, its faults.

    `from_template` copies a data directory made once per session (`make_template`), so that an
    instance starts in a fraction of a second instead of initialising one.
    """

    kind = ""
    user = "root"
    url_prefix = ""  # scheme and user of the URL
    server_database = ""  # the database a fresh data directory has
    stop_signal = signal.SIGTERM

    def __init__(self, home: Path, database: str = "test") -> None:
        self.dir = home
        self.database = database
        self.port = free_port()
        self.log_path = home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_template(cls, template: Path) -> Self:
        home = server_home(cls.kind)
        subprocess.run(["cp", "-a", str(template / "data"), str(home / "data")], check=True)
        shutil.chown(home, cls.user, cls.user)
        return cls(home)

    @classmethod
    @contextlib.contextmanager
    def running(cls, template: Path) -> Iterator[Self]:
        """A started instance copied from `template`, stopped and deleted on exit (a test that fails too)."""
        instance = cls.from_template(template).start()
        try:
            yield instance
        finally:
            instance.remove()

    @classmethod
    def make_template(cls, home: Path) -> Path:
        """A data directory with a `test` database, in the empty `home`: what every instance copies."""
        shutil.chown(home, cls.user, cls.user)
        cls.initialise(home / "data")
        first = cls(home, database=cls.server_database).start()
        engine = sql.make_engine(first.url, sql.EngineSettings(pool_size=1))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("CREATE DATABASE test"))
        engine.dispose()
        first.stop()
        return home

    @staticmethod
    def initialise(data: Path) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"{self.url_prefix}@127.0.0.1:{self.port}/{self.database}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 20.0) -> Self:
        """Start on the data directory; returns once a query is answered."""
        # setpriv execs the server in its own process (same pid) as `user`, with a parent-death signal:
        # the server dies with the test process, however that ends
        as_user = [f"--reuid={self.user}", f"--regid={self.user}", "--clear-groups"] if self.user != "root" else []
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["setpriv", "--pdeathsig=KILL", *as_user, "--", *self.command()],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        wait_until(self._answers, timeout, interval=0.02, what=f"the private {self.kind} on port {self.port}")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"private {self.kind} exited with {self.proc.returncode}; log:\n{self.log()[-3000:]}")
        engine = sql.make_engine(self.url, sql.EngineSettings(pool_size=1, connect_timeout=2))
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        finally:
            engine.dispose()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pids(self) -> list[int]:
        """The server's processes, the main one first (PostgreSQL's backends are its children)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *_children(self.proc.pid)]

    def _signal_all(self, sig: int, main_first: bool = True) -> None:
        pids = self.pids()  # the main process first: stopped, it starts no more children
        for pid in pids if main_first else reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """SIGSTOP every process of the server: connections stay open and nothing answers (a stalled host)."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        self._signal_all(signal.SIGCONT, main_first=False)

    def kill9(self) -> None:
        """SIGKILL every process of the server at once, as a crash of its host would; returns when all are gone."""
        pids = self.pids()
        self._signal_all(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        wait_until(lambda: not any(_alive(pid) for pid in pids), 10, what=f"the private {self.kind} to die")

    def stop(self, timeout: float = 15.0) -> None:
        """A clean, fast shutdown that ends open sessions; SIGKILL after `timeout` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def restart(self, kill: bool = False) -> Self:
        """Stop cleanly (with `kill`: SIGKILL) and start again on the same port and data."""
        if kill:
            self.kill9()
        else:
            self.stop()
        return self.start()

    def remove(self) -> None:
        """Stop for good and delete the home directory."""
        self.stop()
        self.release()
        shutil.rmtree(self.dir, ignore_errors=True)

    def release(self) -> None:
        """Free what a killed server left outside its home directory."""


def _postgres_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if not found:
        pytest.fail("PostgreSQL's server programs are missing (/usr/lib/postgresql/*/bin): run "
                    "scripts/ensure_test_services.sh, which installs the postgresql package", pytrace=False)
    return str(found[-1])


class PostgresInstance(_Instance):
    """A private PostgreSQL on 127.0.0.1:`port`, user postgres (trust), database `test`; runs as user postgres."""

    kind = "postgresql"
    user = "postgres"  # postgres refuses to run as root
    url_prefix = "postgresql://postgres"
    server_database = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: ends open sessions instead of waiting for them

    def release(self) -> None:
        # a killed postmaster leaves its small System V segment (its id is in postmaster.pid); a clean stop
        # removes both, and the next start would reuse it
        pid_file = self.dir / "data" / "postmaster.pid"
        lines = pid_file.read_text().splitlines() if pid_file.exists() else []
        if len(lines) >= 7 and len(lines[6].split()) == 2:
            subprocess.run(["ipcrm", "-m", lines[6].split()[1]], stderr=subprocess.DEVNULL, check=False)

    @staticmethod
    def initialise(data: Path) -> None:
        subprocess.run(["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", "--",
                        _postgres_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync",
                        "-E", "UTF8", "--locale=C.UTF-8", "--no-instructions"],
                       check=True, stdout=subprocess.DEVNULL)

    def command(self) -> list[str]:
        # TCP only; no fsync: a crash of the process loses nothing, the kernel keeps what was written;
        # dynamic shared memory in the data directory, so that a killed server leaves none in /dev/shm
        return [_postgres_bin("postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off",
                "-c", "dynamic_shared_memory_type=mmap",
                "-c", "shared_buffers=16MB", "-c", "max_connections=60"]


class MariaDBInstance(_Instance):
    """A private MariaDB on 127.0.0.1:`port`, root without a password, database `test`."""

    kind = "mariadb"
    url_prefix = "mysql://root"
    server_database = "mysql"

    @staticmethod
    def initialise(data: Path) -> None:
        # creates root@localhost, root@127.0.0.1 and root@::1 without a password
        subprocess.run([shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db", "--no-defaults",
                        f"--datadir={data}", "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db", "--innodb-log-file-size=16M"],
                       check=True, stdout=subprocess.DEVNULL)

    def command(self) -> list[str]:
        # --no-defaults: none of the machine server's settings (its port, socket, data directory)
        return ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={self.dir / 'data'}", f"--port={self.port}",
                f"--socket={self.dir / 'mysqld.sock'}", f"--pid-file={self.dir / 'mysqld.pid'}",
                "--bind-address=127.0.0.1", "--user=root", "--skip-name-resolve", "--skip-log-bin",
                "--character-set-server=utf8mb4",
                "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M", f"--log-error={self.log_path}"]
