"""Utilisation over time per GPU, in equal steps: what a chart of the report draws.

Steps that are whole hours are read from the hourly rollups (a year in 8,760 rows per GPU at
most); shorter ones from the minutes, unless retention dropped minutes inside the window
(`shortest_step`). A rollup counts when it starts inside [since, until), and a step starts on a
multiple of itself (epoch time), so the first and last steps may be partial.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.ledger.queries import GpuInfo, gpus
from gpubox.ledger.rollup import HOUR, MINUTE
from gpubox.ledger.store import LedgerStore

_MS = 1000.0


@dataclass(frozen=True)
class SeriesPoint:
    start: float
    observed_s: float
    allocated_s: float
    busy_s: float | None  # null where busy was never known in the step

    @property
    def busy_share(self) -> float | None:
        """Busy over observed time (0..1); null where either is missing."""
        return self.busy_s / self.observed_s if self.busy_s is not None and self.observed_s else None


@dataclass(frozen=True)
class GpuSeries:
    label: str
    uuid: str
    points: tuple[SeriesPoint, ...]  # only the steps with observed time, in order


def shortest_step(store: LedgerStore, since: float, until: float) -> int:
    """A minute; an hour where retention dropped minutes of an hour inside the window (an hour row
    holds exactly the sum of its minutes, so minutes short of it were pruned)."""
    [(pruned,)] = store.rows(
        "SELECT EXISTS (SELECT 1 FROM gpu_hours h WHERE h.hour > ? AND h.hour < ? AND h.observed_ms >"
        " (SELECT COALESCE(SUM(m.observed_ms), 0) FROM gpu_minutes m"
        " WHERE m.minute >= h.hour AND m.minute < h.hour + ? AND m.gpu = h.gpu))",
        (since - HOUR, until, HOUR),
    )
    return HOUR if pruned else MINUTE


def gpu_series(store: LedgerStore, since: float, until: float, step_s: int) -> tuple[GpuSeries, ...]:
    if step_s < MINUTE or step_s % MINUTE:
        raise ValueError("a chart step must be a whole number of minutes")
    table, key = ("gpu_hours", "hour") if step_s % HOUR == 0 else ("gpu_minutes", "minute")
    with store.reading():
        info = gpus(store)
        rows = store.rows(
            f"SELECT gpu, {key} - {key} % ? AS step, SUM(observed_ms), SUM(allocated_ms), SUM(busy_ms),"
            f" SUM(observed_ms - busy_unknown_ms) FROM {table} WHERE {key} >= ? AND {key} < ?"
            " GROUP BY gpu, step ORDER BY gpu, step",
            (step_s, since, until),
        )
    points: dict[int, list[SeriesPoint]] = {}
    for gpu, start, observed, allocated, busy, busy_known in rows:
        point = SeriesPoint(float(start), observed / _MS, allocated / _MS, busy / _MS if busy_known else None)
        points.setdefault(gpu, []).append(point)
    found = [(info[g], p) for g, p in points.items() if g in info]
    found.sort(key=lambda item: _order(item[0]))
    return tuple(GpuSeries(i.label, i.uuid, tuple(p)) for i, p in found)


def _order(info: GpuInfo) -> tuple[int, int]:
    """By index, a card before its instances (instance 0 too), a GPU without an index last."""
    index = info.index if info.index is not None else 1 << 30
    return index, info.mig_instance if info.mig_instance is not None else -1
