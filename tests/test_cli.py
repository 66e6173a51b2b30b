"""exportctl against a real gateway and backend: exit codes, output with and without a terminal, Ctrl-C."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exports_client import ExportsClient
from tests.client_stack import ClientStack, start_stack
from tests.conftest import DEMO_KEY, gateway_config
from tests.procs import ROOT, Service, free_port

EXPORTCTL = str(Path(sys.executable).parent / "exportctl")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n
UNKNOWN_ID = "exp-20261129-0000000000000000"


@pytest.fixture(scope="module")
def stack(module_services: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory) -> ClientStack:
    return start_stack(module_services, tmp_path_factory.mktemp("cli"))


def env(stack: ClientStack, **extra: str) -> dict[str, str]:
    return {**os.environ, "EXPORTS_URL": stack.gateway.url, "EXPORTS_API_KEY": DEMO_KEY, **extra}


def exportctl(stack: ClientStack, *args: str, extra: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXPORTCTL, *args], check=False, env=env(stack, **(extra or {})), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def no_control_characters(*texts: str) -> None:
    for text in texts:
        assert not CONTROL.search(text), repr(CONTROL.search(text))


def test_submit_wait_download_exits_0_with_plain_lines_and_json(stack: ClientStack, tmp_path: Path) -> None:
    dest = tmp_path / "report.csv"
    out = exportctl(stack, "submit", "report_export", "--filter", "metric=revenue", "--filter", "metric=visits",
                    "--filters-json", '{"date_from": "2026-01-01"}', "--download", str(dest), "--json")
    assert out.returncode == 0, out.stderr
    task = json.loads(out.stdout)
    assert task["status"] == "COMPLETED" and task["progress"] == 100
    assert dest.stat().st_size == task["result"]["bytes"]
    lines = dest.read_text().splitlines()
    assert lines[0].startswith("day,") and {line.split(",")[2] for line in lines[1:]} <= {"revenue", "visits"}
    assert f"submitted {task['task_id']}" in out.stderr and "COMPLETED 100%" in out.stderr
    no_control_characters(out.stdout, out.stderr)
    status = exportctl(stack, "status", task["task_id"])
    assert status.returncode == 0 and status.stdout.startswith(f"{task['task_id']} COMPLETED 100%")
    listed = exportctl(stack, "list", "--status", "COMPLETED", "--json")
    assert listed.returncode == 0 and task["task_id"] in [t["task_id"] for t in json.loads(listed.stdout)]
    again = exportctl(stack, "download", task["task_id"], str(tmp_path / "again.csv"))
    assert again.returncode == 0 and (tmp_path / "again.csv").read_bytes() == dest.read_bytes()


def test_types_lists_each_type_with_its_filters(stack: ClientStack) -> None:
    out = exportctl(stack, "types")
    assert out.returncode == 0
    assert any(line.startswith("order_export: filters ") and "date_from" in line for line in out.stdout.splitlines())
    as_json = json.loads(exportctl(stack, "types", "--json").stdout)
    assert {t["export_type"] for t in as_json} >= {"order_export", "user_export", "report_export"}


def test_a_task_that_ends_failed_or_cancelled_exits_1(stack: ClientStack) -> None:
    failed = exportctl(stack, "submit", "broken_export", "--wait", "--max-wait", "60")
    assert failed.returncode == 1, failed.stderr
    assert " FAILED " in failed.stdout
    submitted = exportctl(stack, "submit", "slow_export", "--json")
    task_id = json.loads(submitted.stdout)["task_id"]
    assert exportctl(stack, "cancel", task_id).returncode == 0
    waited = exportctl(stack, "wait", task_id)
    assert waited.returncode == 1 and "CANCELLED" in waited.stdout
    refused = exportctl(stack, "download", task_id, "/tmp/never-written")
    assert refused.returncode == 1 and "only a COMPLETED task has a file" in refused.stderr


@pytest.mark.parametrize("args,extra", [
    (["submit", "no_such_type"], {}),                                   # 422
    (["submit", "report_export", "--filter", "nonsense"], {}),          # not KEY=VALUE
    (["submit", "report_export", "--filter", "bogus=1"], {}),           # unknown filter: 422
    (["submit", "report_export", "--format", "xml"], {}),               # a format the type does not offer: 422
    (["list", "--status", "BOGUS"], {}),                                # a status the gateway does not know: 422
    (["status", UNKNOWN_ID], {"EXPORTS_API_KEY": "not-a-key"}),         # 401
    (["frobnicate"], {}),                                               # no such command
])
def test_usage_and_refusals_exit_2(stack: ClientStack, args: list[str], extra: dict[str, str]) -> None:
    out = exportctl(stack, *args, extra=extra)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip()


def test_not_found_exits_4_even_though_it_is_a_4xx(stack: ClientStack) -> None:
    for args in (["status", UNKNOWN_ID], ["wait", UNKNOWN_ID], ["cancel", UNKNOWN_ID], ["status", "not-an-id"]):
        out = exportctl(stack, *args)
        assert out.returncode == 4, (args, out.stderr)


def test_unreachable_or_unavailable_after_retries_exits_5(stack: ClientStack) -> None:
    dead = exportctl(stack, "status", UNKNOWN_ID, "--url", f"http://127.0.0.1:{free_port()}")
    assert dead.returncode == 5 and "could not reach" in dead.stderr
    started = time.monotonic()
    down = exportctl(stack, "status", UNKNOWN_ID, "--url", f"{stack.gateway.url}/down")
    assert down.returncode == 5 and "50300" in down.stderr
    assert time.monotonic() - started < 40  # retries are bounded


def test_max_wait_reached_exits_3_on_time_and_says_how_to_resume(stack: ClientStack) -> None:
    started = time.monotonic()
    out = exportctl(stack, "submit", "slow_export", "--wait", "--max-wait", "3")
    elapsed = time.monotonic() - started
    assert out.returncode == 3, out.stderr
    assert elapsed < 10, elapsed
    task_id = out.stdout.split()[0]
    assert f"Resume with: exportctl wait {task_id}" in out.stderr
    no_control_characters(out.stdout, out.stderr)
    resumed = exportctl(stack, "wait", task_id, "--max-wait", "2")
    assert resumed.returncode == 3
    with ExportsClient(stack.gateway.url, DEMO_KEY) as c:
        assert c.cancel(task_id).status == "CANCELLED"


# exportctl started as a script's background job or a supervisor may start it: SIGINT ignored and blocked (both
# survive the exec)
SIGINT_IGNORED_AND_BLOCKED = [sys.executable, "-c", "import os, signal, sys; "
                              "signal.signal(signal.SIGINT, signal.SIG_IGN); "
                              "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
                              "os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.mark.parametrize("started", ["as usual", "with SIGINT ignored and blocked"])
def test_ctrl_c_while_waiting_leaves_the_task_running_and_says_how_to_resume(stack: ClientStack, started: str
                                                                          ) -> None:
    launcher = [] if started == "as usual" else SIGINT_IGNORED_AND_BLOCKED
    proc = subprocess.Popen([*launcher, EXPORTCTL, "submit", "slow_export", "--wait"], env=env(stack), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # "submitted <id> (PENDING)": the wait has begun
    task_id = first.split()[1]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert f"task {task_id} keeps running" in err and f"exportctl wait {task_id}" in err
    assert "Traceback" not in err
    with ExportsClient(stack.gateway.url, DEMO_KEY) as c:
        assert c.get(task_id).status in ("PENDING", "RUNNING")
        c.cancel(task_id)


def test_a_gateway_killed_mid_wait_is_reported_within_seconds_then_the_wait_ends_with_how_to_resume(
        stack: ClientStack, services: Callable[..., Service], tmp_path: Path) -> None:
    gateway = services("gateway", gateway_config(tmp_path, stack.backend.url))
    proc = subprocess.Popen([EXPORTCTL, "submit", "slow_export", "--wait"], env=env(stack, EXPORTS_URL=gateway.url),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        task_id = proc.stderr.readline().split()[1]  # "submitted <id> (PENDING)": the wait has begun
        proc.stderr.readline()  # its first state: the wait follows the task's event stream
        gateway.kill()
        killed = time.monotonic()
        line = proc.stderr.readline()
        while line and "could not reach the gateway" not in line:
            line = proc.stderr.readline()
        noticed = time.monotonic() - killed
        assert f"could not reach the gateway at {gateway.url}" in line and "retrying in" in line
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert noticed < 8, noticed
    assert proc.returncode == 5, err
    assert f"could not reach {gateway.url}" in err  # the last try's error, then what to do
    assert f"task {task_id} keeps running" in err and f"Resume with: exportctl wait {task_id}" in err
    assert "Traceback" not in err
    with ExportsClient(stack.gateway.url, DEMO_KEY) as c:
        assert c.cancel(task_id).status == "CANCELLED"


def test_on_a_terminal_a_progress_bar_shows_progress_step_and_elapsed_time(stack: ClientStack) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: exportctl with a terminal for stdout and stderr
        os.execve(EXPORTCTL, [EXPORTCTL, "submit", "report_export", "--wait"], env(stack, COLUMNS="120"))
    screen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = screen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "\x1b[" in text                                  # drawn with terminal control sequences
    assert "100%" in text and re.search(r"\d:\d\d:\d\d", text)  # progress and elapsed time
    assert re.search(r"store|render|query|COMPLETED", text)   # the step
