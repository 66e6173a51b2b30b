"""Attacks by a half-written config on SQL sources: a table, column or query the database does not have is refused
when the config loads (check-config exits 2, a backend does not start), naming the type, on SQLite as on
PostgreSQL and MariaDB; never loaded with a warning to fail at the first task."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from exports_common import sql
from tests.conftest import backend_config
from tests.databases import SqlDatabase
from tests.procs import ROOT, free_port


def write_config(tmp_path: Path, source: dict[str, Any]) -> Path:
    config = backend_config(tmp_path)
    config["export_types"] = {"half_written": {"source": source, "filters": {"v": {"type": "string", "column": "v"}},
                                               "formats": ["csv"]}}
    path = tmp_path / "backend.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backend_stub", "check-config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, env={**os.environ, "EXPORTS_DEV": "1"})


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    with sqlite3.connect(tmp_path / "data.db") as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, tenant TEXT, v TEXT)")
    return f"sqlite:///{tmp_path / 'data.db'}"


@pytest.mark.parametrize(("source", "said"), [
    ({"table": "no_such_table"}, "no such table: no_such_table"),
    ({"query": "SELECT id, v FROM no_such_table"}, "no such table: no_such_table"),
    ({"query": "SELECT id, v FROM t WHERE"}, "syntax error"),
    ({"table": "t", "tenant_column": "owner"}, "tenant_column: the source has no column 'owner'"),
])
def test_a_sqlite_source_naming_what_the_file_lacks_is_refused_by_check_config(
        tmp_path: Path, sqlite_url: str, source: dict[str, Any], said: str) -> None:
    run = check_config(write_config(tmp_path, {"kind": "sql", "url": sqlite_url, "key": "id", **source}))
    said_all = run.stdout + run.stderr
    assert run.returncode == 2, said_all
    assert "export_types.half_written.source" in said_all and said in said_all, said_all
    assert "Traceback" not in said_all


def test_a_backend_does_not_start_on_a_sqlite_source_naming_a_missing_table(tmp_path: Path, sqlite_url: str) -> None:
    path = write_config(tmp_path, {"kind": "sql", "url": sqlite_url, "key": "id", "table": "no_such_table"})
    run = subprocess.run([sys.executable, "-m", "backend_stub", "run", "--config", str(path), "--port",
                          str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "EXPORTS_DEV": "1"})
    assert run.returncode != 0
    assert "half_written" in run.stdout + run.stderr and "no such table" in run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_table_dropped_after_load_fails_the_sqlite_attempt_for_good_not_as_retryable(sqlite_url: str) -> None:
    engine = sql.make_engine(sqlite_url, sql.EngineSettings(pool_size=1))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT * FROM dropped"))
    except sa.exc.SQLAlchemyError as error:
        refused = sql.sql_error(error, sqlite_url)
    finally:
        engine.dispose()
    assert isinstance(refused, sql.SqlFailed) and not refused.retryable and "no such table" in str(refused)


def test_a_server_database_naming_a_missing_table_is_refused_by_check_config(tmp_path: Path,
                                                                             sql_database: SqlDatabase) -> None:
    run = check_config(write_config(tmp_path, {"kind": "sql", "url": sql_database.url, "key": "id",
                                               "table": "no_such_table"}))
    assert run.returncode == 2 and "export_types.half_written.source" in run.stderr, run.stdout + run.stderr
