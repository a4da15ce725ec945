"""The figures of a snapshot, written out apart from gpubox's own table, and the checks that a
scrape exported each one as the snapshot has it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpubox.telemetry.model import GpuSnapshot, ProcessSnapshot
from tests.metrics.support import SampleKey, key

# Metric name to (snapshot field, divisor into the metric's unit), written out apart from the catalog.
GPU_FIGURES = {
    "gpubox_gpu_busy_ratio": ("gpu_busy", 100),
    "gpubox_gpu_sm_active_ratio": ("sm_active", 100),
    "gpubox_gpu_sm_occupancy_ratio": ("sm_occupancy", 100),
    "gpubox_gpu_pcie_tx_bytes_per_second": ("pcie_tx_Bps", 1),
    "gpubox_gpu_pcie_rx_bytes_per_second": ("pcie_rx_Bps", 1),
    "gpubox_gpu_pcie_link_generation": ("pcie_link_gen", 1),
    "gpubox_gpu_pcie_link_max_generation": ("pcie_link_gen_max", 1),
    "gpubox_gpu_pcie_link_width_lanes": ("pcie_link_width", 1),
    "gpubox_gpu_pcie_link_max_width_lanes": ("pcie_link_width_max", 1),
    "gpubox_gpu_memory_used_bytes": ("mem_used_bytes", 1),
    "gpubox_gpu_memory_total_bytes": ("mem_total_bytes", 1),
    "gpubox_gpu_power_watts": ("power_w", 1),
    "gpubox_gpu_power_limit_watts": ("power_limit_w", 1),
    "gpubox_gpu_temperature_celsius": ("temperature_c", 1),
    "gpubox_gpu_energy_joules_total": ("energy_mj", 1000),
    "gpubox_gpu_lost": ("lost", 1),
}
PROCESS_FIGURES = {
    "gpubox_process_sm_util_ratio": ("sm_util", 100),
    "gpubox_process_gpu_memory_bytes": ("gpu_mem_bytes", 1),
    "gpubox_process_loader_wait_ratio": ("loader_wait", 1),
}
GPU_UUID = "GPU-11111111-2222-4333-8444-555555555555"
MIG_UUID = "MIG-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"


def gpu_labels(g: GpuSnapshot) -> dict[str, str]:
    return {"gpu": g.label, "uuid": g.uuid, "name": g.name}


def process_labels(p: ProcessSnapshot, gpu: str) -> dict[str, str]:
    job = "" if p.job_id is None else str(p.job_id)
    return {
        "gpu": gpu,
        "uuid": p.gpu_uuid,
        "pid": str(p.pid),
        "user": p.user or "",
        "job": job,
        "kind": p.job_kind or "",
    }


def assert_gpus_match(found: Mapping[SampleKey, float], gpus: tuple[GpuSnapshot, ...]) -> None:
    for g in gpus:
        for name, (field, divisor) in GPU_FIGURES.items():
            raw = getattr(g, field)
            k = key(name, gpu_labels(g))
            if raw is None:
                assert k not in found, f"{name} of GPU {g.label} has no figure, yet a sample"
            else:
                assert found[k] == pytest.approx(raw / divisor, rel=1e-12), (name, g.label)


def assert_processes_match(
    found: Mapping[SampleKey, float], procs: tuple[ProcessSnapshot, ...], gpu_label: dict[str, str]
) -> None:
    for p in procs:
        for name, (field, divisor) in PROCESS_FIGURES.items():
            raw = getattr(p, field)
            k = key(name, process_labels(p, gpu_label[p.gpu_uuid]))
            if raw is None:
                assert k not in found, f"{name} of pid {p.pid} has no figure, yet a sample"
            else:
                assert found[k] == pytest.approx(raw / divisor, rel=1e-12), (name, p.pid)
