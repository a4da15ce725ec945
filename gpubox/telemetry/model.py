"""Frozen snapshots of a box: its GPUs, its GPU processes and its host.

A figure the GPU or driver cannot give is None, and `reasons[field]` says why (one of the
`Reason` values). None is never shown as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Reason(StrEnum):
    NOT_SUPPORTED = "not_supported"  # the GPU or driver does not offer this figure
    NO_PERMISSION = "no_permission"  # offered, but not to this user
    GPU_LOST = "gpu_lost"  # the GPU fell off the bus or needs a reset
    FUNCTION_MISSING = "function_missing"  # the driver is older than the function
    LIBRARY_MISMATCH = "library_mismatch"  # the driver and the NVML bindings disagree on a struct
    WARMING_UP = "warming_up"  # a rate that needs a second sample, or stack samples not yet taken
    NO_PROCESS = "no_process"  # the pid is gone or hidden (another PID namespace)
    NOT_MEASURED = "not_measured"  # nothing measures it (loader_wait: no probe, no stack sampling)
    PROBE_UNREADABLE = "probe_unreadable"  # the probe file is corrupt, cut short or always torn
    NO_BATCHES_YET = "no_batches_yet"  # the probe is attached, but no batch was asked for yet
    ERROR = "error"  # anything else; the error text goes to the snapshot's errors


@dataclass(frozen=True)
class GpuId:
    """A GPU or MIG instance as a backend names it when it opens, before it reads any figure."""

    index: int  # NVML index; MIG instances carry their parent's index
    uuid: str


@dataclass(frozen=True)
class GpuSnapshot:
    index: int  # NVML index; MIG instances carry their parent's index
    uuid: str
    name: str
    pci_bus_id: str | None
    mig_instance: int | None = None  # the MIG GPU instance id, when this is a MIG device
    lost: bool = False
    gpu_busy: float | None = None  # % of time any kernel ran: not occupancy
    mem_busy: float | None = None  # % of time memory was read or written
    sm_active: float | None = None  # GPM SM_UTIL %
    sm_occupancy: float | None = None  # GPM SM_OCCUPANCY %
    pcie_tx_Bps: float | None = None
    pcie_rx_Bps: float | None = None
    pcie_source: str | None = None  # "gpm", "counters" or "throughput"
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None  # as nvidia-smi shows it: without the driver's reserved memory
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = None  # the GPU's energy counter: millijoules since the driver loaded (Volta and newer)
    temperature_c: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_event_reasons: tuple[str, ...] | None = None  # throttle reasons now active
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.index}" if self.mig_instance is None else f"{self.index}/{self.mig_instance}"

    @property
    def mem_used_fraction(self) -> float | None:
        if self.mem_total_bytes and self.mem_used_bytes is not None:
            return self.mem_used_bytes / self.mem_total_bytes
        return None


@dataclass(frozen=True)
class ProcessSnapshot:
    pid: int  # a host pid, also for processes inside containers
    gpu_index: int
    gpu_uuid: str
    # "compute", "graphics", "compute+graphics" (in both lists), or "mps" (a client of an MPS
    # server, which is "compute")
    kind: str
    user: str | None = None
    command: str | None = None
    sm_util: float | None = None
    gpu_mem_bytes: int | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    start_time: float | None = None  # epoch seconds
    loader_wait: float | None = None  # fraction of wall time blocked on the next batch
    loader_wait_source: str | None = None  # "probe", "sampled" or None (unknown)
    loader_wait_samples: int | None = None  # stack samples behind a "sampled" loader_wait
    batches_per_s: float | None = None  # batches the probe saw delivered, over the same window
    job_id: int | None = None  # the gpubox queue job that started it; None: none, or unreadable (reasons)
    job_kind: str | None = None  # that job's kind: infer, quantize, train, batch or other
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, str]:
        return (self.pid, self.gpu_uuid)


@dataclass(frozen=True)
class HostSnapshot:
    hostname: str
    cpu_percent: float | None = None
    cpu_count: int | None = None
    load_1m: float | None = None
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None


@dataclass(frozen=True)
class BoxSnapshot:
    taken_at: float  # epoch seconds
    backend: str  # "nvml" or "simulated"
    host: HostSnapshot
    gpus: tuple[GpuSnapshot, ...]
    processes: tuple[ProcessSnapshot, ...]
    errors: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()  # one-line advice, e.g. how to allow stack sampling

    def only_gpus(self, uuids: frozenset[str]) -> BoxSnapshot:
        """The same snapshot restricted to the GPUs and MIG instances with these UUIDs."""
        return BoxSnapshot(
            self.taken_at,
            self.backend,
            self.host,
            tuple(g for g in self.gpus if g.uuid in uuids),
            tuple(p for p in self.processes if p.gpu_uuid in uuids),
            self.errors,
            self.notices,
        )
