"""The issue's claimers test on PostgreSQL: 8 claimers in 2 processes, a running cap of 2, 2,000 claims.

A file per database, so that pytest-xdist (which deals whole files to its workers) runs the two at once.
"""
from __future__ import annotations

from pathlib import Path

from tests.databases import SqlDatabase
from tests.sql_claimers import check_claimers


def test_eight_claimers_in_two_processes_keep_the_cap_and_the_weights_over_2000_claims(
        pg_database: SqlDatabase, tmp_path: Path) -> None:
    check_claimers(pg_database.url, tmp_path)
