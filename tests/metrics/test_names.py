"""Metric names follow Prometheus conventions, and gpubox.metrics stays a core package."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpubox.metrics
from gpubox.metrics.catalog import (
    ALL_METRICS,
    GPU_LABELS,
    GPU_LOST,
    GPU_METRICS,
    LEDGER_METRICS,
    PROCESS_LABELS,
    PROCESS_METRICS,
    QUEUE_JOBS,
)
from tests.test_core_imports import CHILD, FORBIDDEN

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
GAUGE_UNITS = ("_ratio", "_bytes", "_bytes_per_second", "_watts", "_celsius", "_lanes")
COUNTER_UNITS = ("_joules_total", "_seconds_total")
UNITLESS = {  # counts and levels, which have no unit to name
    "gpubox_gpu_pcie_link_generation",
    "gpubox_gpu_pcie_link_max_generation",
    "gpubox_gpu_lost",
    "gpubox_queue_jobs",
}


@pytest.mark.parametrize("spec", ALL_METRICS, ids=lambda s: s.name)
def test_name_is_snake_case_under_gpubox_with_its_unit_last(spec) -> None:
    assert SNAKE.match(spec.name) and spec.name.startswith("gpubox_"), spec.name
    if spec.counter:
        assert spec.name.endswith(COUNTER_UNITS), f"{spec.name}: a counter ends in <unit>_total"
    else:
        assert not spec.name.endswith("_total"), f"{spec.name}: only counters end in _total"
        assert spec.name.endswith(GAUGE_UNITS) or spec.name in UNITLESS, f"{spec.name}: no unit at the end"
    assert "percent" not in spec.name, "Prometheus uses ratios, not percent"
    assert all(SNAKE.match(label) for label in spec.labels), spec.labels
    assert spec.help.endswith(".") and spec.help[0].isupper(), spec.help


def test_names_are_unique_and_labels_are_those_of_their_level() -> None:
    assert len({s.name for s in ALL_METRICS}) == len(ALL_METRICS)
    for spec in (*GPU_METRICS, GPU_LOST, *LEDGER_METRICS):
        assert spec.labels == GPU_LABELS == ("gpu", "uuid", "name"), spec.name
    for spec in PROCESS_METRICS:
        assert spec.labels == PROCESS_LABELS == ("gpu", "uuid", "pid", "user", "job", "kind"), spec.name
    assert QUEUE_JOBS.labels == ("kind", "state")


def test_the_names_of_the_design() -> None:
    """The metrics of DESIGN.md, each under its Prometheus name."""
    expected = {
        "gpu_busy": "gpubox_gpu_busy_ratio",
        "sm_active": "gpubox_gpu_sm_active_ratio",
        "sm_occupancy": "gpubox_gpu_sm_occupancy_ratio",
        "pcie_tx_Bps": "gpubox_gpu_pcie_tx_bytes_per_second",
        "pcie_rx_Bps": "gpubox_gpu_pcie_rx_bytes_per_second",
        "mem_used_bytes": "gpubox_gpu_memory_used_bytes",
        "mem_total_bytes": "gpubox_gpu_memory_total_bytes",
        "power_w": "gpubox_gpu_power_watts",
        "temperature_c": "gpubox_gpu_temperature_celsius",
        "energy_mj": "gpubox_gpu_energy_joules_total",
    }
    by_field = {s.field: s.name for s in GPU_METRICS}
    assert {f: by_field[f] for f in expected} == expected
    assert {s.field: s.name for s in PROCESS_METRICS} == {
        "sm_util": "gpubox_process_sm_util_ratio",
        "gpu_mem_bytes": "gpubox_process_gpu_memory_bytes",
        "loader_wait": "gpubox_process_loader_wait_ratio",
    }
    assert {s.name for s in LEDGER_METRICS} == {
        "gpubox_gpu_allocated_seconds_total",
        "gpubox_gpu_busy_seconds_total",
        "gpubox_gpu_starved_seconds_total",
    }


def test_metrics_package_imports_no_ui_framework() -> None:
    root = Path(next(iter(gpubox.metrics.__path__)))
    modules = [
        "gpubox.metrics",
        *(f"gpubox.metrics.{f.stem}" for f in sorted(root.glob("*.py")) if f.stem != "__init__"),
    ]
    assert "gpubox.metrics.exposition" in modules
    result = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(FORBIDDEN), *modules],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


def test_the_help_of_serve_names_the_ledger_counters() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpubox", "metrics", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for spec in LEDGER_METRICS:
        assert spec.name in out, spec.name
