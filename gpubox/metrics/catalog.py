"""Every metric gpubox exports, in one table: its name, help, labels and where its value comes from.

Names follow Prometheus conventions: snake case under `gpubox_`, the base unit at the end of the
name (ratio, bytes, bytes_per_second, watts, celsius, joules, seconds, lanes) and `_total` at
the end of every counter. A figure the snapshot does not have (None) is left out of the scrape:
Prometheus has no null, and 0 would be a lie.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_LABELS = ("gpu", "uuid", "name")  # gpu is the index, or "0/3" for MIG instance 3 of GPU 0
PROCESS_LABELS = ("gpu", "uuid", "pid", "user", "job", "kind")  # job and kind are empty outside the queue
QUEUE_LABELS = ("kind", "state")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    help: str
    labels: tuple[str, ...]
    counter: bool = False
    field: str | None = None  # the snapshot field it is read from
    scale: float = 1.0  # divides the snapshot's figure into the metric's unit: % to ratio, mJ to J


def _gpu(name: str, field: str, help: str, scale: float = 1.0, counter: bool = False) -> MetricSpec:
    return MetricSpec(f"gpubox_gpu_{name}", help, GPU_LABELS, counter, field, scale)


def _process(name: str, field: str, help: str, scale: float = 1.0) -> MetricSpec:
    return MetricSpec(f"gpubox_process_{name}", help, PROCESS_LABELS, field=field, scale=scale)


GPU_METRICS = (
    _gpu("busy_ratio", "gpu_busy", "Share of time any kernel ran (gpu_busy); not occupancy.", 100),
    _gpu("sm_active_ratio", "sm_active", "Share of SMs with at least one warp resident (GPM SM_UTIL).", 100),
    _gpu("sm_occupancy_ratio", "sm_occupancy", "Resident warps over the maximum (GPM SM_OCCUPANCY).", 100),
    _gpu("pcie_tx_bytes_per_second", "pcie_tx_Bps", "Bytes per second sent over the PCIe link, GPU to host."),
    _gpu("pcie_rx_bytes_per_second", "pcie_rx_Bps", "Bytes per second received over the PCIe link, host to GPU."),
    _gpu("pcie_link_generation", "pcie_link_gen", "PCIe generation the link runs at now."),
    _gpu("pcie_link_max_generation", "pcie_link_gen_max", "Highest PCIe generation the link can run at."),
    _gpu("pcie_link_width_lanes", "pcie_link_width", "PCIe lanes the link runs with now."),
    _gpu("pcie_link_max_width_lanes", "pcie_link_width_max", "Most PCIe lanes the link can run with."),
    _gpu("memory_used_bytes", "mem_used_bytes", "GPU memory in use, without the driver's own reserve (as nvidia-smi)."),
    _gpu("memory_total_bytes", "mem_total_bytes", "GPU memory in all."),
    _gpu("power_watts", "power_w", "Power drawn now."),
    _gpu("power_limit_watts", "power_limit_w", "Power limit in force."),
    _gpu("temperature_celsius", "temperature_c", "GPU temperature."),
    _gpu("energy_joules_total", "energy_mj", "Energy used since the driver loaded.", 1000, counter=True),
)

# Always known, so a lost GPU still has a series to alert on.
GPU_LOST = _gpu("lost", "lost", "Whether the GPU fell off the bus or needs a reset: 1 when it did, else 0.")

PROCESS_METRICS = (
    _process("sm_util_ratio", "sm_util", "Share of time the process ran kernels on the GPU (sm_util).", 100),
    _process("gpu_memory_bytes", "gpu_mem_bytes", "GPU memory the process holds."),
    _process(
        "loader_wait_ratio", "loader_wait", "Share of wall time the process waited for its next batch (loader_wait)."
    ),
)

QUEUE_JOBS = MetricSpec("gpubox_queue_jobs", "Jobs in the gpubox queue, by kind and state.", QUEUE_LABELS)
QUEUE_STATES = ("queued", "running")

LEDGER_METRICS = (  # read from the ledger's GpuSeconds, by GPU UUID
    _gpu("allocated_seconds_total", "allocated_s", "Seconds the GPU was allocated to a queue job.", counter=True),
    _gpu("busy_seconds_total", "busy_s", "Seconds the GPU was busy.", counter=True),
    _gpu(
        "starved_seconds_total",
        "starved_s",
        "Seconds the GPU was allocated, times the holding job's loader_wait: time the job's GPU waited for data.",
        counter=True,
    ),
)

ALL_METRICS = (*GPU_METRICS, GPU_LOST, *PROCESS_METRICS, QUEUE_JOBS, *LEDGER_METRICS)
