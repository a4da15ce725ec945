"""What the exporter asks of the GPU-hours ledger: each GPU's totals, by UUID, at every scrape."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSeconds:
    """One GPU's totals since recording began; None where the ledger does not know one."""

    allocated_s: float | None = None  # held by a queue job
    busy_s: float | None = None
    starved_s: float | None = None  # allocated seconds times the holding job's loader_wait
    # The GPU as the ledger last saw it ("0", or "0/3" for a MIG instance, and its name): the
    # labels of its counters once it has left the box, so that they stay one series.
    label: str = ""
    name: str = ""


LedgerTotals = Callable[[], Mapping[str, GpuSeconds]]  # GPU UUID to its totals
