"""A bounded subset of the chaos tool's scenarios, as tests: two gateways, two backends, one Redis, faults.

The whole table (every scenario, at a higher rate) is `python -m benchmarks.chaos`, in benchmarks/RESULTS.md.
`db_kill` runs the backends' store on a PostgreSQL of its own, killed -9 under load and started again 3 s later;
a restart and a stall shorter than the lease are tests/test_sql_store.py's. A failed run keeps its directory
(every process's log and the client's journal of each submit's answer) and names it in the outcome's note.
"""
from __future__ import annotations

import pytest

from benchmarks.chaos import Outcome, run_scenario


def assert_nothing_lost(outcome: Outcome) -> None:
    assert outcome.obtained == outcome.submitted, outcome
    assert outcome.lost == 0, outcome
    assert outcome.duplicated == 0, outcome
    assert outcome.bad_5xx == 0, outcome
    assert outcome.completed == outcome.obtained, outcome


@pytest.mark.parametrize("scenario", ["redis_stall", "backend_kill"])
def test_scenario_loses_nothing_duplicates_nothing_and_answers_no_500(scenario: str) -> None:
    assert_nothing_lost(run_scenario(scenario, rate=3.0, seconds=6.0, fault_at=2.0))


@pytest.mark.parametrize("scenario", ["db_kill"])
def test_database_fault_loses_nothing_runs_nothing_twice_and_says_unready(scenario: str) -> None:
    outcome = run_scenario(scenario, rate=3.0, seconds=6.0, fault_at=2.0)
    assert_nothing_lost(outcome)
    assert outcome.rerun_after_kill == 0, outcome  # no worker died: no task may start twice
    assert outcome.readyz_503 is True, outcome  # every /readyz answered 503 with Retry-After while it was down
