"""A bounded subset of the chaos tool's scenarios, as tests: two gateways, two backends, one Redis, faults;
and the backends' store on a PostgreSQL of the scenario's own, killed -9 under load (a restart and a stall
shorter than the lease are tests/test_sql_store.py's).

The whole table (every scenario, at a higher rate) is `python -m benchmarks.chaos`, in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import pytest

from benchmarks.chaos import run_scenario


@pytest.mark.parametrize("scenario", ["redis_stall", "backend_kill", "db_kill"])
def test_scenario_loses_nothing_duplicates_nothing_and_answers_no_500(scenario: str) -> None:
    outcome = run_scenario(scenario, rate=3.0, seconds=6.0, fault_at=2.0)
    assert outcome.obtained == outcome.submitted, outcome
    assert outcome.lost == 0, outcome
    assert outcome.duplicated == 0, outcome
    assert outcome.bad_5xx == 0, outcome
    assert outcome.completed == outcome.obtained, outcome
    if scenario == "db_kill":  # the gateways' retries may hide the 503s from the client: /readyz shows the outage
        assert outcome.readyz_503, outcome
        assert outcome.rerun_after_kill == 0, f"no worker died, so no task ran again: {outcome}"
