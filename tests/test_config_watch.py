"""The gateway applies an edit of its config file by itself (watchfiles), once per edit, and refuses a broken one."""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

from tests.conftest import ADMIN_TOKEN, gateway_config
from tests.procs import Service, free_port, wait_until
from tests.test_observability import metric, scrape

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _state(gateway: Service) -> tuple[str, float, float]:
    """(config hash in force, reloads applied, reloads refused) from /metrics."""
    text = scrape(gateway)
    found = re.search(r'^gateway_config_info\{hash="([0-9a-f]{16})"\} 1\.0$', text, re.M)
    assert found, "the config in force is named by its hash"
    return (found.group(1), metric(text, "gateway_config_reloads_total", outcome="applied") or 0.0,
            metric(text, "gateway_config_reloads_total", outcome="refused") or 0.0)


def _save(path: Path, text: str) -> None:
    """As editors save: a new file renamed over the old one (a watch on the old file would miss it)."""
    scratch = path.with_name(path.name + ".saving")
    scratch.write_text(text)
    os.replace(scratch, path)


def _routes(gateway: Service) -> dict[str, dict[str, Any]]:
    """The routes in force, by name, as /admin/routes shows them."""
    config = httpx.get(f"{gateway.url}/admin/routes", headers=ADMIN, timeout=10).json()["data"]
    return {r["name"]: r for r in config["routes"]}


def _route(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in config["routes"] if r["name"] == name)


def test_each_edit_of_the_config_file_is_applied_once_and_a_broken_one_refused(
        services: Callable[..., Service], tmp_path: Path) -> None:
    # no backend: reloading needs none, and its absence keeps the test to the watcher
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    start_hash, applied, refused = _state(gateway)
    assert (applied, refused) == (0, 0)
    text = gateway.config_path.read_text()

    # events without a change of content: rewritten as it was, then touched
    _save(gateway.config_path, text)
    os.utime(gateway.config_path)
    config = yaml.safe_load(text)
    _route(config, "list")["max_body_bytes"] = 1001
    # the edit arrives in pieces, as a slow writer makes it: several events, one change in the end
    with gateway.config_path.open("w") as out:
        out.write(yaml.safe_dump(config, sort_keys=False)[:100])
        out.flush()
        out.write(yaml.safe_dump(config, sort_keys=False)[100:])
    first = wait_until(lambda: (s := _state(gateway))[0] != start_hash and s, 10, interval=0.1,
                       what="the watcher to apply the edit")
    assert _routes(gateway)["list"]["max_body_bytes"] == 1001

    # the next edit's reload comes after any left over from the first: the count is exact
    _route(config, "list")["max_body_bytes"] = 1002
    _save(gateway.config_path, yaml.safe_dump(config, sort_keys=False))
    second = wait_until(lambda: (s := _state(gateway))[0] != first[0] and s, 10, interval=0.1,
                        what="the watcher to apply the second edit")
    # the piecewise first write may have been seen half-done (refused) before it was whole
    assert first[1] == 1 and second[1] == 2, "one reload per edit: unchanged saves and touches reload nothing"

    _save(gateway.config_path, "routes: [this is not a config\n")
    wait_until(lambda: _state(gateway)[2] > second[2], 10, interval=0.1, what="the watcher to refuse the broken edit")
    assert _state(gateway)[:2] == second[:2], "the config in force keeps serving"
    assert _routes(gateway)["list"]["max_body_bytes"] == 1002
    assert "config reload refused" in gateway.log() and "Traceback" not in gateway.log()


def _routes_last(config: dict[str, Any]) -> str:
    """The config as YAML with its routes written last, as the shipped file has them."""
    return yaml.safe_dump({k: v for k, v in config.items() if k != "routes"} | {"routes": config["routes"]},
                          sort_keys=False)


def test_a_half_written_config_that_drops_routes_is_refused_until_an_operator_applies_it(
        services: Callable[..., Service], tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    whole = _routes_last(gateway.config)
    _save(gateway.config_path, whole)  # the same config, its routes last: nothing to apply
    names = list(_routes(gateway))
    assert len(names) >= 4
    # written in place and caught mid-write: valid YAML, a valid config, with only the first three routes
    cut = whole.index(f"- name: {names[3]}\n")
    with gateway.config_path.open("w") as out:
        out.write(whole[:cut])
        out.flush()
        wait_until(lambda: metric(scrape(gateway), "gateway_config_reloads_total", outcome="refused_removals"), 10,
                   interval=0.05, what="the watcher to refuse the truncated file")
        assert list(_routes(gateway)) == names, "every route still serves"
        # (the watcher may see the write in more than one state, each refused: count from here on)
        refused = metric(scrape(gateway), "gateway_config_reloads_total", outcome="refused_removals") or 0.0
        gateway.signal(signal.SIGHUP)
        wait_until(lambda: "sighup" in gateway.log(), 10, interval=0.05, what="SIGHUP to refuse it too")
        assert (metric(scrape(gateway), "gateway_config_reloads_total", outcome="refused_removals") or 0.0) > refused
        # what an operator gets when asking without saying the removals are meant
        asked = httpx.post(f"{gateway.url}/admin/reload", headers=ADMIN, timeout=10)
        assert asked.status_code == 422 and f"route {names[3]}" in asked.json()["data"]["removals"]
        assert httpx.post(f"{gateway.url}/admin/reload?allow_removals=maybe", headers=ADMIN).status_code == 422
        assert list(_routes(gateway)) == names
    log = gateway.log()
    assert "config reload refused: it removes" in log and f"route {names[-1]}" in log and "sighup" in log
    assert metric(scrape(gateway), "gateway_config_reloads_total", outcome="applied") == 0

    # an operator who means it
    applied = httpx.post(f"{gateway.url}/admin/reload?allow_removals=true", headers=ADMIN, timeout=10)
    assert applied.status_code == 200, applied.text
    assert list(_routes(gateway)) == names[:3]


def test_a_log_file_beside_the_config_does_not_feed_the_watcher(
        services: Callable[..., Service], tmp_path: Path) -> None:
    # the test's gateway logs to tmp_path/<name>.log, beside its config tmp_path/<name>.yaml
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    assert gateway.log_path.parent == gateway.config_path.parent
    neighbour = gateway.config_path.with_name("other.log")
    for n in range(20):  # another writer in the directory: none of its events is the config's
        with neighbour.open("a") as out:
            out.write(f"line {n}\n")
    # the gateway's own lines land there too: the watcher must not react to them, nor log that it saw them
    assert httpx.get(f"{gateway.url}/admin/routes", timeout=10).status_code == 401
    sizes = [gateway.log_path.stat().st_size]

    def settled() -> bool:  # a second (three samples) without a byte more
        sizes.append(gateway.log_path.stat().st_size)
        return len(set(sizes[-3:])) == 1 and len(sizes) >= 3

    wait_until(settled, 6, interval=0.5, what="the log to stop growing (the watcher feeding on it)")
    assert "change detected" not in gateway.log() and "changes detected" not in gateway.log()
    assert _state(gateway)[1:] == (0, 0), "no reload was tried"


def _warnings(gateway: Service) -> list[str]:
    """The settings named by the 'weakens security' warnings in the gateway's log, in order."""
    lines = [json.loads(line) for line in gateway.log().splitlines() if line.startswith("{")]
    return [line["setting"] for line in lines
            if line["level"] == "warning" and line["msg"] == "config reload weakens security"]


def test_a_reload_that_weakens_security_warns_naming_each_setting(services: Callable[..., Service],
                                                                  tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}",
                                                 metrics_auth="admin_token"))
    config = dict(gateway.config, metrics_auth="none", trusted_proxies=["10.0.0.0/8"])
    _route(config, "export_types")["plugins"] = [p for p in _route(config, "export_types")["plugins"]
                                             if p != "auth" and "auth" not in p]
    _route(config, "cancel")["plugins"] = [{"auth": {"required": False}} if p == "auth" else p
                                           for p in _route(config, "cancel")["plugins"]]
    _route(config, "download")["plugins"] = [p for p in _route(config, "download")["plugins"]
                                             if not (isinstance(p, dict) and "signed_download" in p)]
    _save(gateway.config_path, yaml.safe_dump(config, sort_keys=False))
    # removing plugins needs an operator; the watcher refused it and warned of nothing
    wait_until(lambda: metric(httpx.get(f"{gateway.url}/metrics", headers=ADMIN, timeout=10).text,
                              "gateway_config_reloads_total", outcome="refused_removals"), 10,
               interval=0.05, what="the watcher to refuse the removals")
    assert _warnings(gateway) == []
    applied = httpx.post(f"{gateway.url}/admin/reload?allow_removals=true", headers=ADMIN, timeout=10)
    assert applied.status_code == 200, applied.text
    assert _warnings(gateway) == [
        "metrics_auth: admin_token -> none (/metrics answers without the admin token)",
        "routes.export_types: auth removed (requests pass without its check)",
        "routes.cancel: auth.required true -> false (anonymous requests pass)",
        "routes.download: signed_download removed (requests pass without its check)",
        "trusted_proxies: 10.0.0.0/8 added (their forwarding headers are believed)"]
