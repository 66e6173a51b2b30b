"""Attacks by a tenant's filters on a SQL source: a list filter naming one value tens of thousands of times (each
value is a bound parameter, and PostgreSQL takes at most 65,535 in one statement) is refused at submit with a 422
naming the filter, instead of failing every attempt of the task as a broken connection; each value once exports
the rows of those values (the default limits, 8 KiB of filters, keep such a list under the cap; raised ones
do not). A type declaring a list filter on a column of free text is refused when it loads."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from backend_stub.filters import FilterSpec, filters_schema
from exports_common import sql
from tests.conftest import backend_config
from tests.databases import SqlDatabase
from tests.helpers import backend_create, wait_status
from tests.procs import Service

STATUSES = ["new", "paid", "shipped"]


def test_a_list_filter_repeating_a_value_is_refused_and_each_value_once_exports_their_rows(
        services: Callable[..., Service], pg_database: SqlDatabase, tmp_path: Path) -> None:
    engine = sql.make_engine(pg_database.url, sql.EngineSettings(pool_size=1))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, tenant TEXT, status TEXT)")
        conn.exec_driver_sql("INSERT INTO orders VALUES (1, 't1', 'new'), (2, 't1', 'paid'), (3, 't1', 'shipped')")
    engine.dispose()
    # limits raised for large filter payloads: 70,000 values fit, past PostgreSQL's bound-parameter cap
    backend = services("backend_stub", backend_config(tmp_path, max_body_bytes=1_048_576, max_filters_bytes=1_048_576,
                                                      export_types={"orders": {
        "source": {"kind": "sql", "url": pg_database.url, "table": "orders", "key": "id", "tenant_column": "tenant"},
        "filters": {"status": {"type": "enum", "column": "status", "values": STATUSES, "multiple": True}}}}))
    flood = backend_create(backend.url, {"export_type": "orders", "filters": {"status": ["paid"] * 70_000}})
    assert flood.status_code == 422, flood.text
    assert "filters.status" in flood.text and "more than once" in flood.text
    each_once = backend_create(backend.url, {"export_type": "orders", "filters": {"status": ["paid", "new"]}})
    assert each_once.status_code == 201, each_once.text
    done = wait_status(backend.url, each_once.json()["data"]["task_id"], timeout=30)
    assert done["status"] == "COMPLETED" and done["result"]["rows"] == 2, done


def test_a_list_filter_on_free_text_is_refused_at_load_and_the_schema_bounds_every_list() -> None:
    with pytest.raises(ValidationError, match="multiple: true is for enum filters only"):
        FilterSpec.model_validate({"type": "string", "column": "customer", "multiple": True})
    spec = FilterSpec.model_validate({"type": "enum", "column": "status", "values": STATUSES, "multiple": True})
    listed = filters_schema({"status": spec})["properties"]["status"]["anyOf"][1]
    assert listed["maxItems"] == len(STATUSES) and listed["uniqueItems"] is True
