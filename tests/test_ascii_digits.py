"""Numbers read from untrusted text take ASCII digits only.

`str.isdigit()` also takes '²' and other scripts' digits, which `int()` then refuses
with a ValueError: a 500 where the caller is owed a 4xx envelope (servers), or an
exception out of a download or a wait (SDK). The servers' cases run over real
processes; the SDK's parsers and the declared-length check need none.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import httpx
import pytest

from exports_client import sse
from exports_client.core import _range_start
from exports_common.json_body import read_limited
from exports_common.task_ids import new_task_id
from tests.conftest import ADMIN_TOKEN
from tests.helpers import assert_envelope_error
from tests.procs import Service, backend_headers

OTHER_DIGITS = ["\u00b2", "\u0663", "\uff11\uff12"]  # superscript two, Arabic-Indic three, fullwidth one two
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.parametrize("digits", OTHER_DIGITS)
def test_an_admin_page_limit_in_other_digits_is_422(stack: tuple[Service, Service], digits: str) -> None:
    backend, gateway = stack
    for path in ("/internal/tasks", "/internal/callbacks/failed"):
        direct = httpx.get(f"{backend.url}{path}", params={"tenant": "demo", "limit": digits},
                           headers=backend_headers(), timeout=10)
        assert assert_envelope_error(direct, 422, 42200)["data"]["field"] == "limit"
    for path in ("/admin/recovery/tasks", "/admin/recovery/callbacks"):
        forwarded = httpx.get(f"{gateway.url}{path}", params={"tenant": "demo", "limit": digits}, headers=ADMIN,
                              timeout=10)
        assert assert_envelope_error(forwarded, 422, 42200)["data"]["field"] == "limit"
    assert httpx.get(f"{backend.url}/internal/tasks", params={"tenant": "demo", "limit": "2"},
                     headers=backend_headers(), timeout=10).status_code == 200


def test_an_active_task_quota_in_other_digits_is_422(stack: tuple[Service, Service]) -> None:
    backend, _ = stack
    # a header is Latin-1 on the wire: '¹', '²', '³' are the digits beyond ASCII it can carry
    sent = [(name.encode(), value.encode()) for name, value in backend_headers("demo").items()]
    for quota in (b"\xb2", b"\xb9", b"1\xb3"):
        resp = httpx.post(f"{backend.url}/exports", json={"export_type": "report_export"}, timeout=10,
                          headers=[*sent, (b"X-Task-Id", new_task_id().encode()),
                                   (b"X-Tenant-Max-Active-Tasks", quota)])
        assert assert_envelope_error(resp, 422, 42200)["data"]["field"] == "X-Tenant-Max-Active-Tasks"
    accepted = httpx.post(f"{backend.url}/exports", json={"export_type": "report_export"}, timeout=10,
                          headers=backend_headers("demo") | {"X-Task-Id": new_task_id(),
                                                             "X-Tenant-Max-Active-Tasks": "5"})
    assert accepted.status_code == 201, accepted.text
    for service in stack:
        assert "Traceback" not in service.log(), service.log()[-4000:]


@pytest.mark.inprocess
def test_the_sdk_takes_no_other_digits_from_a_server() -> None:
    parser = sse.EventParser()
    for line in ("retry: 2500", "retry: \u00b2", "retry: \u0663", "data: x", ""):
        event = parser.feed(line)
    assert isinstance(event, sse.Event) and event.retry_ms == 2500, "a retry in other digits is ignored"
    assert _range_start("bytes 100-199/200") == 100
    assert [_range_start(f"bytes {d}-199/200") for d in OTHER_DIGITS] == [None] * 3


@pytest.mark.inprocess
def test_a_content_length_in_other_digits_is_left_to_the_streamed_count() -> None:
    async def chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    for declared in OTHER_DIGITS:
        assert asyncio.run(read_limited(chunks([b"ab", b"c"]), 10, declared)) == b"abc"
