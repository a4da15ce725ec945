"""Fixed-size histories of the figures the live view graphs, per GPU and per process."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, TypeVar

from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, ProcessSnapshot

DEFAULT_LENGTH = 300  # five minutes at the default 1 s refresh

Series = deque[float | None]
_K = TypeVar("_K")


def _series(length: int) -> Series:
    return deque(maxlen=length)


class GpuHistory:
    def __init__(self, length: int = DEFAULT_LENGTH) -> None:
        self.gpu_busy = _series(length)
        self.sm_active = _series(length)
        self.sm_occupancy = _series(length)
        self.pcie_rx = _series(length)
        self.pcie_tx = _series(length)
        self.mem_used = _series(length)  # a fraction of the total
        self.power = _series(length)
        self.temperature = _series(length)

    def push(self, gpu: GpuSnapshot) -> None:
        self.gpu_busy.append(gpu.gpu_busy)
        self.sm_active.append(gpu.sm_active)
        self.sm_occupancy.append(gpu.sm_occupancy)
        self.pcie_rx.append(gpu.pcie_rx_Bps)
        self.pcie_tx.append(gpu.pcie_tx_Bps)
        self.mem_used.append(gpu.mem_used_fraction)
        self.power.append(gpu.power_w)
        self.temperature.append(gpu.temperature_c)

    @property
    def sm_occupancy_known(self) -> bool:
        return any(v is not None for v in self.sm_occupancy)

    @property
    def has_sm_active(self) -> bool:
        return any(v is not None for v in self.sm_active)

    def activity(self) -> tuple[str, Series]:
        """SM activity where GPM gives it; otherwise gpu_busy, labelled as such."""
        return ("SM", self.sm_active) if self.has_sm_active else ("busy", self.gpu_busy)


class ProcessHistory:
    def __init__(self, length: int = DEFAULT_LENGTH) -> None:
        self.sm_util = _series(length)
        self.gpu_mem = _series(length)
        self.cpu_percent = _series(length)
        self.rss = _series(length)
        self.loader_wait = _series(length)
        self.batches_per_s = _series(length)

    def push(self, proc: ProcessSnapshot) -> None:
        self.sm_util.append(proc.sm_util)
        self.gpu_mem.append(None if proc.gpu_mem_bytes is None else float(proc.gpu_mem_bytes))
        self.cpu_percent.append(proc.cpu_percent)
        self.rss.append(None if proc.rss_bytes is None else float(proc.rss_bytes))
        self.loader_wait.append(proc.loader_wait)
        self.batches_per_s.append(proc.batches_per_s)


class BoxHistory:
    """Histories keyed by GPU uuid and by (pid, GPU uuid); what leaves the box is forgotten."""

    def __init__(self, length: int = DEFAULT_LENGTH) -> None:
        self.length = length
        self.gpus: dict[str, GpuHistory] = {}
        self.processes: dict[tuple[int, str], ProcessHistory] = {}

    def record(self, snap: BoxSnapshot) -> None:
        for gpu in snap.gpus:
            self.gpus.setdefault(gpu.uuid, GpuHistory(self.length)).push(gpu)
        for proc in snap.processes:
            self.processes.setdefault(proc.key, ProcessHistory(self.length)).push(proc)
        _forget(self.gpus, {g.uuid for g in snap.gpus})
        _forget(self.processes, {p.key for p in snap.processes})


def _forget(table: dict[_K, Any], keep: Iterable[_K]) -> None:
    gone = table.keys() - set(keep)
    for key in gone:
        del table[key]
