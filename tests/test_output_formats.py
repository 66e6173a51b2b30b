"""The output formats' writers, in process: the output rules for every kind of value, and today's bytes kept."""
from __future__ import annotations

import csv
import io
import json
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend_stub.datasets import DATASETS
from backend_stub.formats import FORMATS, WriteOptions

pytestmark = pytest.mark.inprocess  # no server process: `make test-fast` runs it

EDGE_COLUMNS = ("null", "empty", "day", "aware", "naive", "decimal", "binary", "flag", "text")
EDGE_ROW = (None, "", date(2026, 2, 3), datetime(2026, 2, 3, 4, 5, 6, 789, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 2, 3, 4, 5, 6), Decimal("12345678901234567890.1234567890"), b"\x00\xffbin", True,
            'Ünïcödé, "quoted"\nline')


def render(fmt: str, columns: tuple[str, ...], batches: list[list[tuple[Any, ...]]], **options: Any) -> bytes:
    out = io.BytesIO()
    writer = FORMATS[fmt].open(out, columns, WriteOptions(**options))
    for batch in batches:
        writer.write(batch)
    writer.close()
    return out.getvalue()


def test_csv_follows_the_output_rules_for_every_kind_of_value() -> None:
    lines = render("csv", EDGE_COLUMNS, [[EDGE_ROW]]).decode().split("\r\n", 1)
    assert lines[0] == ",".join(EDGE_COLUMNS)
    # NULL empty and unquoted, "" quoted; the zone converted to UTC with Z; no offset without one; every digit
    assert lines[1] == (',"",2026-02-03,2026-02-03T02:05:06.000789Z,2026-02-03T04:05:06,'
                        '12345678901234567890.1234567890,AP9iaW4=,true,"Ünïcödé, ""quoted""\nline"\r\n')


def test_jsonl_follows_the_output_rules_with_decimals_as_exact_numbers() -> None:
    body = render("jsonl", EDGE_COLUMNS, [[EDGE_ROW]])
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    assert b'"decimal":12345678901234567890.1234567890,' in body  # a number, not a string, digits as stored
    row = json.loads(body, parse_float=Decimal)
    assert list(row) == list(EDGE_COLUMNS)
    assert row == {"null": None, "empty": "", "day": "2026-02-03", "aware": "2026-02-03T02:05:06.000789Z",
                   "naive": "2026-02-03T04:05:06", "decimal": Decimal("12345678901234567890.1234567890"),
                   "binary": "AP9iaW4=", "flag": True, "text": 'Ünïcödé, "quoted"\nline'}


def test_numbers_wider_than_64_bits_and_small_decimals_keep_every_digit() -> None:
    row = (2**70, -(2**65), Decimal("1E-7"), Decimal("-0.00"), Decimal("1E+3"), 1.5, time(1, 2, 3))
    columns = tuple(f"c{i}" for i in range(len(row)))
    texts = "1180591620717411303424,-36893488147419103232,0.0000001,-0.00,1000,1.5,01:02:03"
    assert render("csv", columns, [[row]]).decode().splitlines()[1] == texts
    assert render("jsonl", columns, [[row]]) == (
        b'{"c0":1180591620717411303424,"c1":-36893488147419103232,"c2":0.0000001,"c3":-0.00,"c4":1000,'
        b'"c5":1.5,"c6":"01:02:03"}\n')


def test_a_lone_null_in_a_one_column_csv_is_an_empty_line_and_an_empty_batch_writes_nothing() -> None:
    assert render("csv", ("only",), [[(None,), ("",)], [], [("x",)]]) == b'only\r\n\r\n""\r\nx\r\n'


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.text(), st.integers(), st.floats(allow_nan=False)),
                         min_size=3, max_size=3).map(tuple), max_size=20))
def test_csv_reads_back_as_written_and_tells_null_from_empty(rows: list[tuple[Any, ...]]) -> None:
    text = render("csv", ("a", "b", "c"), [rows]).decode()
    parsed = list(csv.reader(io.StringIO(text, newline="")))
    assert parsed[0] == ["a", "b", "c"]
    assert parsed[1:] == [["" if v is None else str(v) for v in row] for row in rows]
    # each field quoted as the csv module quotes it alone, but for NULL (empty) and "" (quoted)
    expected = "".join(",".join(_as_csv_writes(v) for v in row) + "\r\n" for row in rows)
    assert text.split("\r\n", 1)[1] == expected


def _as_csv_writes(value: Any) -> str:
    if value is None:
        return ""
    if value == "":
        return '""'
    one = io.StringIO()
    csv.writer(one).writerow([value])
    return one.getvalue().removesuffix("\r\n")


def test_csv_escape_formulas_prefixes_text_cells_that_a_spreadsheet_would_run() -> None:
    rows = [("=SUM(A1)", "+1", "-x", "@me", "plain", -5, "", None, "a=b")]
    body = render("csv", ("=head", "b", "c", "d", "e", "f", "g", "h", "i"), [rows], escape_formulas=True).decode()
    assert body.splitlines() == ["'=head,b,c,d,e,f,g,h,i", """'=SUM(A1),'+1,'-x,'@me,plain,-5,"",,a=b"""]
    assert render("csv", ("a",), [[("=1",)]]) == b"a\r\n=1\r\n"  # off by default
    assert render("jsonl", ("a",), [[("=1",)]], escape_formulas=True) == b'{"a":"=1"}\n'  # CSV only


@pytest.mark.parametrize("dataset", ["orders", "users", "report"])
def test_the_synthetic_data_sets_are_written_byte_for_byte_as_before(dataset: str) -> None:
    """What the csv module and json.dumps wrote before the writers existed."""
    data = DATASETS[dataset]
    rows = list(data.generate(3, 12_000))
    batches = [rows[i:i + 5000] for i in range(0, len(rows), 5000)]
    before_csv = io.StringIO()
    csv.writer(before_csv).writerows([data.columns, *rows])
    before_jsonl = "".join(json.dumps(dict(zip(data.columns, row, strict=True)), separators=(",", ":")) + "\n"
                           for row in rows)
    assert render("csv", data.columns, batches) == before_csv.getvalue().encode()
    assert render("jsonl", data.columns, batches) == before_jsonl.encode()
