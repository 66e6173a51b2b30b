"""The SQL task store's tables (PostgreSQL, MariaDB/MySQL) and their versioned migrations.

The schema is created or brought up to date at start, under an advisory lock (`pg_advisory_lock`,
`GET_LOCK`), so backends starting together do not race: the first one migrates, the others wait and
then find the version current. `store_schema` holds the version; each migration moves it by one.
"""
from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection

metadata = sa.MetaData()

# a record as JSON: MEDIUMTEXT on MariaDB/MySQL (TEXT holds 64 KiB only)
_Json = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
_Id = sa.String(64)  # task ids, tenants, consumer names: ASCII, short
_Time = sa.Float(precision=53).with_variant(mysql.DOUBLE(asdecimal=False), "mysql", "mariadb")  # epoch seconds

tasks = sa.Table(
    "exports_tasks", metadata,
    sa.Column("task_id", _Id, primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", _Time, nullable=False),
    sa.Column("expire_at", _Time),
    sa.Column("callback_due", _Time),
    sa.Column("body", _Json, nullable=False),
    sa.Index("exports_tasks_by_tenant", "tenant", "created_at", "task_id"),
    sa.Index("exports_tasks_active", "tenant", "status"),
    sa.Index("exports_tasks_by_expiry", "expire_at"),
    sa.Index("exports_tasks_by_callback_due", "callback_due"),
)

# the work queue: a row per queued task; leased rows are the running ones
queue = sa.Table(
    "exports_queue", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("task_id", _Id, nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("lease_owner", sa.String(128)),
    sa.Column("lease_until", _Time),
    sa.Index("exports_queue_by_tenant", "tenant", "lease_until", "seq"),
    sa.Index("exports_queue_by_lease", "lease_until"),
    sa.Index("exports_queue_by_task", "task_id"),
)

# one row per tenant that ever queued: its pass in the fair turns (backend_stub.store.fair), locked by a
# claim so that two claimers never both see the tenant below its running cap
turns = sa.Table(
    "exports_turns", metadata,
    sa.Column("tenant", sa.String(128), primary_key=True),
    sa.Column("turn", sa.BigInteger, nullable=False),  # its pass: the lowest is served next
    sa.Column("served_at_turn", sa.BigInteger, nullable=False),  # its pass when last served: the virtual time
)

changes = sa.Table(
    "exports_changes", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("task_id", _Id, nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("at", _Time, nullable=False),
    sa.Column("task", _Json, nullable=False),
    sa.Index("exports_changes_by_time", "at"),
)

# one row: the last change id issued (its row lock, held to commit, makes id order the commit order)
# and the newest id trimmed away
change_log = sa.Table(
    "exports_change_log", metadata,
    sa.Column("one", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("last_id", sa.BigInteger, nullable=False),
    sa.Column("trimmed_through", sa.BigInteger, nullable=False),
)

callback_claims = sa.Table(
    "exports_callback_claims", metadata,
    sa.Column("task_id", _Id, primary_key=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("holder", sa.String(128), nullable=False),
    sa.Column("until", _Time, nullable=False),
)

# export types' definitions as written, under their digest (backend_stub.registry): a task names the one it was
# created under
type_definitions = sa.Table(
    "exports_type_definitions", metadata,
    sa.Column("digest", _Id, primary_key=True),
    sa.Column("definition", _Json, nullable=False),
    sa.Column("recorded_at", _Time, nullable=False, server_default="0"),  # its last recording: unused ones go
)

schema_version = sa.Table(
    "exports_store_schema", metadata,
    sa.Column("one", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("version", sa.Integer, nullable=False),
)


def _v1(conn: Connection) -> None:
    # each step may find itself done already: a backend killed mid-way left it so
    metadata.create_all(conn, tables=[tasks, queue, turns, changes, change_log, callback_claims])
    if conn.execute(sa.select(change_log.c.one)).first() is None:
        conn.execute(change_log.insert().values(one=1, last_id=0, trimmed_through=0))


def _v2(conn: Connection) -> None:
    metadata.create_all(conn, tables=[type_definitions])


def _v3(conn: Connection) -> None:
    # definitions kept before this count as recorded long ago: the janitor removes them once no task names them
    if "recorded_at" not in {column["name"] for column in sa.inspect(conn).get_columns(type_definitions.name)}:
        column = type_definitions.c.recorded_at
        kind = column.type.compile(dialect=conn.dialect)
        conn.exec_driver_sql(f"ALTER TABLE {type_definitions.name} ADD COLUMN {column.name} {kind} NOT NULL DEFAULT 0")


# index i moves the schema from version i to i + 1; each must be safe to run again after a crash part-way
MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2, _v3]
VERSION = len(MIGRATIONS)
LOCK_NAME = "exports_task_store_schema"
LOCK_KEY = 0x6578706F7274  # pg_advisory_lock's bigint: "export" in ASCII


class SchemaTooNew(Exception):
    """The database was migrated by a newer release than this one."""


def current_version(conn: Connection) -> int:
    if not sa.inspect(conn).has_table(schema_version.name):
        return 0
    found = conn.execute(sa.select(schema_version.c.version)).scalar()
    return int(found or 0)


def migrate(conn: Connection, lock_timeout_sec: int = 60) -> tuple[int, int]:
    """Bring the schema to VERSION under the advisory lock; returns (version found, version now).

    Runs on a connection in autocommit mode: each migration commits by itself (MariaDB commits DDL
    anyway), and the version row moves right after it, so a backend killed mid-way resumes from there.
    """
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
    else:
        got = conn.execute(sa.text("SELECT GET_LOCK(:name, :wait)"),
                           {"name": LOCK_NAME, "wait": lock_timeout_sec}).scalar()
        if got != 1:
            raise TimeoutError(f"another backend held the schema lock {LOCK_NAME} for {lock_timeout_sec} s")
    try:
        found = current_version(conn)
        if found > VERSION:
            raise SchemaTooNew(f"the task store's schema is version {found}, newer than this release's {VERSION}: "
                               "run the newer release, or restore a backup taken before the upgrade")
        if found == 0:
            metadata.create_all(conn, tables=[schema_version])
            if conn.execute(sa.select(schema_version.c.one)).first() is None:
                conn.execute(schema_version.insert().values(one=1, version=0))
        for version in range(found, VERSION):
            MIGRATIONS[version](conn)
            conn.execute(schema_version.update().values(version=version + 1))
        return found, VERSION
    finally:
        if postgres:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY})
        else:
            conn.execute(sa.text("SELECT RELEASE_LOCK(:name)"), {"name": LOCK_NAME})
