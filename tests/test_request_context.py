"""The request context's text fields land where they belong: the gateway builds it on every request
(gateway/dispatch.py) from several `str` values, where two swapped would pass the type check.

Each field is given a value of its own and read back where the gateway uses it: the method and the upstream
path in what the upstream received, the route's name in the access log and the upstream metrics, the
upstream's name in the retry metrics, the request id in the answer, the upstream's request and the access log.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.conftest import gateway_config
from tests.procs import Service, wait_until
from tests.test_observability import metric, scrape

ROUTE, UPSTREAM, REQUEST_ID = "ctx-route", "ctx-upstream", "ctx-request-7"


def _access_lines(gateway: Service) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in gateway.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "gateway.access"]


def test_each_text_field_of_the_context_reaches_its_own_use(services: Callable[..., Service],
                                                            tmp_path: Path) -> None:
    echo = services("tests.echo_upstream", {}, name="echo")
    config = gateway_config(tmp_path, echo.url, access_log=True)
    config["upstreams"][UPSTREAM] = {"url": echo.url}
    # a retry on 200 makes the one try the retry counts (labelled with the context's upstream) certain
    config["routes"].append({"name": ROUTE, "path": "/ctx/{rest}", "methods": ["GET"], "upstream": UPSTREAM,
                             "rewrite": "/upstream-side/{rest}", "plugins": [],
                             "policy": {"retry": {"attempts": 2, "retry_on": [200]}}})
    gateway = services("gateway", config)

    resp = httpx.get(f"{gateway.url}/ctx/abc", headers={"X-Request-Id": REQUEST_ID}, timeout=10)

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-request-id"] == REQUEST_ID
    received = resp.json()["data"]
    assert received["method"] == "GET" and received["path"] == "/upstream-side/abc"
    assert dict(received["headers"])["x-request-id"] == REQUEST_ID
    access = wait_until(lambda: [line for line in _access_lines(gateway) if line["request_id"] == REQUEST_ID], 10,
                        what="the request's access line")
    assert len(access) == 1
    assert (access[0]["route"], access[0]["method"], access[0]["path"], access[0]["attempts"]) == \
        (ROUTE, "GET", "/ctx/abc", 2)
    text = scrape(gateway)
    assert metric(text, "gateway_upstream_calls_total", upstream=UPSTREAM, route=ROUTE, outcome="200") == 2
    assert metric(text, "gateway_retries_total", upstream=UPSTREAM, route=ROUTE, reason="200") == 1
