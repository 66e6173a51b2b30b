"""The shipped dashboard and alert rules, checked by promtool and by a real Prometheus scraping a running stack.

Needs Debian's `prometheus` package (the server and promtool); skipped with the reason when it is absent.
"""
from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import yaml

from tests.conftest import DEMO_KEY, backend_config, gateway_config
from tests.helpers import wait_status
from tests.procs import ROOT, SERVICE_TOKEN, Service, free_port, wait_until
from tests.receiver import Receiver

RULES = ROOT / "ops" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "export-gateway.json"
API = "/api/v1/exports"
AUTH = {"Authorization": f"Bearer {DEMO_KEY}"}
pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="prometheus and promtool are not installed (apt-get install prometheus)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60)


def test_rules_are_valid_and_their_unit_tests_fire_and_stay_quiet() -> None:
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = yaml.safe_load((RULES.parent / "alerts_test.yml").read_text())["tests"]
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for case in cases for t in case["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == alerts and quiet == alerts, "every alert has a case that fires and a case that does not"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str], list[str]], str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(backends: list[str], gateways: list[str]) -> str:
        port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [  # a backend answers only callers with its service token, Prometheus too
                      {"job_name": "backends", "static_configs": [{"targets": backends}],
                       "authorization": {"credentials": SERVICE_TOKEN}},
                      {"job_name": "gateways", "static_configs": [{"targets": gateways}]}]}
        path = tmp_path / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        log = open(tmp_path / "prometheus.log", "wb")
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/-/ready").status_code == 200, 30, what="prometheus to be ready")
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


def _traffic(gateway: Service, hook: Receiver) -> None:
    """A few exports with callbacks, a flaky one, listing and polling (misses, then cache hits)."""
    tasks = [httpx.post(f"{gateway.url}{API}", json=body, headers=AUTH, timeout=10).json()["data"]["task_id"]
             for body in ({"export_type": "report_export", "callback_url": hook.url},
                          {"export_type": "flaky_export", "callback_url": hook.url},
                          {"export_type": "report_export"})]
    for task_id in tasks:
        wait_status(gateway.url, task_id, {"COMPLETED"}, path=f"{API}/", headers=AUTH, timeout=30)
        for _ in range(3):
            httpx.get(f"{gateway.url}{API}/{task_id}", headers=AUTH, timeout=10)
    httpx.get(f"{gateway.url}{API}?limit=5", headers=AUTH, timeout=10)
    wait_until(lambda: hook.count() >= 2, 15, what="both callbacks")


def test_every_dashboard_query_has_data_and_the_rules_load(services: Callable[..., Service], tmp_path: Path,
                                                           prometheus: Callable[[list[str], list[str]], str]) -> None:
    with Receiver() as hook:
        backend = services("backend_stub", backend_config(tmp_path, callbacks={"allow_networks": ["127.0.0.0/8"]}))
        gateway = services("gateway", gateway_config(tmp_path, backend.url))
        url = prometheus([backend.url.removeprefix("http://")], [gateway.url.removeprefix("http://")])
        _traffic(gateway, hook)
        panels = json.loads(DASHBOARD.read_text())["panels"]
        exprs = [target["expr"] for panel in panels for target in panel["targets"]]
        assert len(exprs) >= 20
        for expr in exprs:
            wait_until(functools.partial(_query, url, expr), 30, interval=0.5, what=f"data for {expr}")
        assert _query(url, 'sum(backend_tasks{status="COMPLETED"})')[0]["value"][1] == "3"
        groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        shipped = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
        assert len(rules) == len(shipped) >= 8
        wait_until(lambda: all(r.get("lastEvaluation", "").startswith("20") for r in
                               httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"][0]["rules"]), 15,
                   what="the rules to be evaluated")
        health = {r["name"]: r["health"] for g in httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]
                  for r in g["rules"]}
        assert set(health.values()) == {"ok"}, health
        assert not _query(url, "ALERTS"), "a healthy stack fires no alert"
