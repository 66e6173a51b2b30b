"""A hostile or mistaken config file costs little to refuse: size and alias-expansion bounds, loaded off the loop."""
from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import httpx
import pytest

from backend_stub.config import BackendConfig
from exports_common.config_loader import MAX_FILE_BYTES, MAX_NODES, ConfigError, load_model
from gateway.config import GatewayConfig
from tests.conftest import backend_config, gateway_config
from tests.procs import Service, free_port, wait_until
from tests.test_observability import metric, scrape


def alias_bomb(levels: int, fan_out: int = 10) -> str:
    """The "billion laughs" file: each level an anchored list naming the level below `fan_out` times."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * fan_out)}]"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * fan_out)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.inprocess
def test_the_seven_level_alias_bomb_is_refused_within_100_ms_and_20_mb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(7))
    assert path.stat().st_size < 5_000  # 10**7 values once expanded
    for model in (GatewayConfig, BackendConfig):
        # the time without tracemalloc (which slows every allocation), the best of three on a shared machine
        took = []
        for _ in range(3):
            started = time.perf_counter()
            with pytest.raises(ConfigError) as refused:
                load_model(path, model)
            took.append(time.perf_counter() - started)
        assert f"more than {MAX_NODES} values once its aliases" in refused.value.problems[0]
        tracemalloc.start()
        with pytest.raises(ConfigError):
            load_model(path, model)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert min(took) < 0.1 and peak < 20 * 2**20, (took, peak)


@pytest.mark.inprocess
def test_files_over_1_mib_and_aliases_that_contain_themselves_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * (MAX_FILE_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load_model(big, GatewayConfig)
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="contains itself"):
        load_model(loop, GatewayConfig)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError):
        load_model(deep, GatewayConfig)
    # anchors within the bound are fine: 9,000 values once expanded
    fine = tmp_path / "fine.yaml"
    fine.write_text(alias_bomb(2, 20))
    with pytest.raises(ConfigError) as invalid:  # loads as YAML, then fails as a config, naming keys not size
        load_model(fine, GatewayConfig)
    assert "aliases" not in str(invalid.value) and "unknown key" in str(invalid.value)


def test_a_bomb_swapped_under_running_processes_is_refused_without_stalling_them(
        services: Callable[..., Service], tmp_path: Path) -> None:
    backend = services("backend_stub", backend_config(tmp_path))
    gateway = services("gateway", gateway_config(tmp_path, f"http://127.0.0.1:{free_port()}"))
    rss = {s.name: s.rss_bytes() for s in (backend, gateway)}
    slowest, statuses = [0.0], set()
    stop = threading.Event()

    def probe() -> None:  # requests keep being answered while the file is loaded and refused
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                for service in (backend, gateway):
                    started = time.perf_counter()
                    statuses.add(client.get(f"{service.url}/healthz").status_code)
                    slowest[0] = max(slowest[0], time.perf_counter() - started)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        for service in (backend, gateway):
            service.config_path.write_text(alias_bomb(9))  # 10**9 values: an out-of-memory before the bound
        wait_until(lambda: metric(scrape(gateway), "gateway_config_reloads_total", outcome="refused"), 10,
                   interval=0.05, what="the gateway to refuse the bomb")
        wait_until(lambda: metric(scrape(backend), "backend_config_reloads_total", outcome="refused"), 10,
                   interval=0.05, what="the backend to refuse the bomb")
    finally:
        stop.set()
        prober.join(10)
    for service in (backend, gateway):
        assert service.rss_bytes() - rss[service.name] < 20 * 2**20, service.name
        assert "more than 10000 values once its aliases" in service.log() and "Traceback" not in service.log()
    assert statuses == {200} and slowest[0] < 1.0, f"a request waited {slowest[0]:.2f} s while a config was refused"
