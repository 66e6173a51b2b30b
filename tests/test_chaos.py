"""A bounded subset of the chaos tool's scenarios, as tests: two gateways, two backends, one Redis, faults.

The whole table (every scenario, at a higher rate) is `python -m benchmarks.chaos`, in benchmarks/RESULTS.md.
Its `db_kill` (the backends' store on a PostgreSQL of the scenario's own, killed -9 under load) is not here: it
sometimes loses an accepted submit (benchmarks/RESULTS.md, "The task store on PostgreSQL and MariaDB"), which
is open; a restart and a stall shorter than the lease are tests/test_sql_store.py's.
"""
from __future__ import annotations

import pytest

from benchmarks.chaos import run_scenario


@pytest.mark.parametrize("scenario", ["redis_stall", "backend_kill"])
def test_scenario_loses_nothing_duplicates_nothing_and_answers_no_500(scenario: str) -> None:
    outcome = run_scenario(scenario, rate=3.0, seconds=6.0, fault_at=2.0)
    assert outcome.obtained == outcome.submitted, outcome
    assert outcome.lost == 0, outcome
    assert outcome.duplicated == 0, outcome
    assert outcome.bad_5xx == 0, outcome
    assert outcome.completed == outcome.obtained, outcome
