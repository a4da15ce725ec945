"""What the ledger adds up: the usage of one GPU, of one job attempt, or of one user outside the
queue, over some stretch of time. Seconds, joules and bytes; sums that can be added and scaled.

A figure that is unknown for part of the time adds nothing for that part, and its `*_known_s`
says how many seconds it covers, so a report can tell "0" from "never measured".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self

SM_ACTIVE = 1  # busy measured by sm_active (GPM)
GPU_BUSY = 2  # busy measured by gpu_busy (any kernel running)


def busy_source_name(flags: int) -> str | None:
    """The figure busy rests on: "sm_active", "gpu_busy", "mixed" (both, in different minutes) or None."""
    return {0: None, SM_ACTIVE: "sm_active", GPU_BUSY: "gpu_busy"}.get(flags, "mixed")


class Sums:
    """Field-wise addition and scaling for the frozen usage records below."""

    FLAG_FIELDS: ClassVar[frozenset[str]] = frozenset({"busy_source"})  # combined with |, never scaled

    def plus(self, other: Self) -> Self:
        values: dict[str, Any] = {}
        for name in _names(type(self)):
            a, b = getattr(self, name), getattr(other, name)
            values[name] = a | b if name in self.FLAG_FIELDS else a + b
        return type(self)(**values)

    def scaled(self, factor: float) -> Self:
        values: dict[str, Any] = {}
        for name in _names(type(self)):
            value = getattr(self, name)
            values[name] = value if name in self.FLAG_FIELDS else value * factor
        return type(self)(**values)


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(record: type) -> tuple[str, ...]:
    names = _NAMES.get(record)
    if names is None:
        names = _NAMES[record] = tuple(f.name for f in fields(record))
    return names


@dataclass(frozen=True)
class GpuUsage(Sums):
    """One GPU (or MIG instance) over a stretch of time."""

    observed_s: float = 0.0  # time covered by samples no further apart than the max gap
    allocated_s: float = 0.0  # held by a queue job
    busy_s: float = 0.0  # by sm_active where known, else gpu_busy (busy_source says which)
    busy_known_s: float = 0.0
    idle_allocated_s: float = 0.0  # allocated and not busy, where busy is known
    starved_s: float = 0.0  # allocated seconds × the holding job's loader_wait
    loader_known_s: float = 0.0  # allocated seconds for which loader_wait was known
    occupancy_s: float = 0.0  # seconds weighted by sm_occupancy (0..1): mean = occupancy_s / occupancy_known_s
    occupancy_known_s: float = 0.0
    energy_j: float = 0.0  # measured and estimated together
    energy_estimated_j: float = 0.0  # the part of energy_j estimated from power × time
    energy_known_s: float = 0.0
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0
    pcie_known_s: float = 0.0
    unqueued_s: float = 0.0  # processes outside the queue on it, whether a job held it or not
    busy_source: int = 0  # SM_ACTIVE | GPU_BUSY flags


@dataclass(frozen=True)
class AttemptUsage(Sums):
    """One job attempt, summed over its GPUs: GPU-seconds."""

    allocated_s: float = 0.0
    busy_s: float = 0.0
    busy_known_s: float = 0.0
    idle_allocated_s: float = 0.0
    starved_s: float = 0.0
    loader_known_s: float = 0.0
    energy_j: float = 0.0  # its share of its GPUs' energy
    energy_estimated_j: float = 0.0
    energy_known_s: float = 0.0
    busy_source: int = 0


@dataclass(frozen=True)
class UnqueuedUsage(Sums):
    """One user's processes outside the queue, on GPUs held by a job or not: GPU-seconds."""

    gpu_s: float = 0.0
    busy_s: float = 0.0
    busy_known_s: float = 0.0
