"""What the doctor finds, as frozen records: checks, and the facts the checks are made from.

A check has a status (ok, warn, fail, skip), the measured value, one line that says what was
found (for a skip: why it was skipped), what it means, and the fix. Facts are read once (NVML,
/proc and /sys, torch in the user's interpreter) and passed to pure functions that make checks,
so tests give them controlled facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")

# Where a check belongs; `gpubox doctor --only` takes these names.
CATEGORIES = ("driver", "gpu", "pcie", "host", "data", "transfer", "loader")
GPU_CATEGORIES = frozenset({"gpu", "pcie", "transfer"})  # asking for these on a box without GPUs: exit 3


@dataclass(frozen=True)
class Check:
    id: str  # stable key: "<category>.<name>", e.g. "host.shm_size"; unique per GPU
    title: str  # a few words: "/dev/shm size"
    category: str  # one of CATEGORIES
    status: Status
    detail: str  # one line: what was found, with the figure ("64 MiB free of 64 MiB"); for a skip, why
    value: Any = None  # the measured value (number, text, list or mapping), None when not measured
    unit: str | None = None  # of `value`: "bytes", "GB/s", "%", "count", "C", "W", ...
    meaning: str = ""  # what it means for the box or the pipeline
    fix: str | None = None  # a command or a code change; None when there is nothing to do
    gpu: int | None = None  # the GPU index the check is about; None: the whole box
    impact: float = 0.0  # 0..1: the share of speed (or of the box) at stake, to rank findings
    evidence: Mapping[str, Any] = field(default_factory=dict)  # the raw figures behind the verdict


def skipped(id: str, title: str, category: str, why: str, gpu: int | None = None) -> Check:
    """A check that could not run here, saying why."""
    return Check(id=id, title=title, category=category, status="skip", detail=why, gpu=gpu)


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML describes it; a figure NVML does not give is None, and `missing` says why."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str | None  # sysfs form, lower case: "0000:18:00.0"
    architecture: str | None = None  # "hopper", "ampere", ...
    compute_capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None  # current mode
    ecc_pending: bool | None = None  # mode after the next reboot
    ecc_uncorrected_volatile: int | None = None  # since the driver loaded
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None  # over the GPU's life
    ecc_corrected_aggregate: int | None = None
    remapped_rows_corrected: int | None = None  # rows remapped for corrected errors (Ampere and newer)
    remapped_rows_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None  # a remap waits for a GPU reset
    remapped_rows_failed: bool | None = None  # a remap failed: the GPU needs service
    retired_pages_pending: bool | None = None  # a page retirement waits for a reboot (before Ampere)
    power_limit_w: float | None = None  # enforced
    power_default_limit_w: float | None = None
    power_max_limit_w: float | None = None
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None  # where the GPU starts to slow down
    clock_event_reasons: int | None = None  # bit mask (nvmlClocksEventReason*), at rest
    pcie_gen: int | None = None  # now
    pcie_width: int | None = None
    pcie_gen_max: int | None = None  # what the GPU and the slot allow together
    pcie_width_max: int | None = None
    pcie_gen_gpu_max: int | None = None  # what the GPU alone allows
    pcie_replay_count: int | None = None
    missing: Mapping[str, str] = field(default_factory=dict)  # field name -> why it is None


@dataclass(frozen=True)
class LinkSample:
    """One look at a GPU while a benchmark loads it: the link and why clocks are held back."""

    at: float  # monotonic seconds
    gpu: int
    pcie_gen: int | None
    pcie_width: int | None
    clock_event_reasons: int | None
    pcie_replay_count: int | None
    gpu_busy: float | None = None  # % of time a kernel ran


@dataclass(frozen=True)
class SystemFacts:
    """The box as NVML describes it. `nvml_error` says why NVML could not be read (no driver,
    no library, no permission); then `gpus` is empty."""

    driver_version: str | None
    cuda_driver_version: int | None  # 12040 means CUDA 12.4
    gpus: tuple[GpuFacts, ...] = ()
    nvml_error: str | None = None
    nvidia_devices: bool = False  # the kernel knows NVIDIA GPUs (/proc/driver/nvidia or /dev/nvidia*)
