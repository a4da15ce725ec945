"""What the NVML backend keeps about one GPU between refreshes, and the guarded NVML call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpubox.telemetry.model import Reason
from gpubox.telemetry.nvml_errors import PERMANENT, nvml_errors, reason_for


@dataclass
class Device:
    """One GPU, or one MIG instance of a GPU."""

    handle: Any
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None
    mig_instance: int | None = None
    parent_handle: Any = None  # a MIG instance's GPU: GPM samples are taken through it
    mig_parent: bool = False  # a GPU in MIG mode: its instances list the processes
    broken: Reason | None = None  # why nothing can be read any more (lost, or never opened)
    static: dict[str, Any] = field(default_factory=dict)  # figures that do not change
    dead: dict[str, Reason] = field(default_factory=dict)  # calls not to repeat, and why
    gpm_supported: bool | None = None  # None: not known yet
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_filled: int = 0  # how many samples have been taken into gpm_samples
    pcie_source: str | None = None  # the PCIe source in use once one has worked
    pcie_prev: tuple[int, int, int] | None = None  # (timestamp µs, tx bytes, rx bytes)
    proc_util_ts: int = 0  # newest process-utilization sample seen (µs)
    proc_util: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid -> (µs, sm %)
    proc_util_at: float | None = None  # when (the backend's clock, s) the newest sample was first seen
    mem_v2_answered: bool = False  # NVML's v2 memory call has answered for this device


class Caller:
    """Calls NVML for one figure: a failure becomes the figure's reason, a lost GPU marks the
    device broken, a call the driver will never answer is not made again, and any other error
    is kept for the snapshot's `errors`."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.errors = nvml_errors(nvml)
        self.seen: list[str] = []  # unexpected errors of the current refresh

    def __call__(self, dev: Device, key: str, fn: Callable[[], Any], reasons: dict[str, str] | None = None) -> Any:
        dead = dev.dead.get(key)
        if dead is not None:
            if reasons is not None:
                reasons[key] = dead.value
            return None
        try:
            return fn()
        except self.errors as exc:
            reason = self.failed(dev, key, exc)
            if reasons is not None:
                reasons[key] = reason.value
            return None

    def failed(self, dev: Device, key: str, exc: BaseException) -> Reason:
        """Record what a failed call means for the device; returns the figure's reason."""
        reason = reason_for(exc)
        if reason == Reason.GPU_LOST:
            dev.broken = reason
        elif reason in PERMANENT:
            dev.dead[key] = reason
        elif reason == Reason.ERROR:
            self.seen.append(f"GPU {dev.index} {key}: {exc}")
        return reason

    def quiet(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self.errors:
            return None
