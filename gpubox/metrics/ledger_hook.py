"""What the exporter asks of the GPU-hours ledger: each GPU's totals, by UUID, at every scrape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSeconds:
    """One GPU's totals since recording began; None where the ledger does not know one."""

    allocated_s: float | None = None  # held by a queue job
    busy_s: float | None = None
    starved_s: float | None = None  # busy, while its job waited for data


LedgerTotals = Callable[[], Mapping[str, GpuSeconds]]  # GPU UUID to its totals
