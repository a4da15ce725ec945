"""What a report reads from the ledger: sums over a window [since, until), in seconds.

Per-GPU figures come from whole hours where the window covers them and from minutes at its two
ends, so a report over a year reads some 9,000 rows per GPU rather than 525,600. A minute that the
window cuts counts for the share of it inside the window, as if its use were spread evenly over it
(where retention dropped the minutes sooner than the hours, the window's two part hours are
missing). Per-attempt and unqueued figures are kept per hour: every
hour that overlaps the window counts whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpubox.ledger.rollup import HOUR, MINUTE
from gpubox.ledger.schema import ATTEMPT_COLUMNS, GPU_COLUMNS, UNQUEUED_COLUMNS
from gpubox.ledger.store import LedgerStore, tags_of
from gpubox.ledger.usage import AttemptUsage, GpuUsage, UnqueuedUsage


@dataclass(frozen=True)
class GpuInfo:
    id: int
    uuid: str
    index: int | None
    name: str | None
    mig_instance: int | None
    mig_parent: bool
    last_at: float | None

    @property
    def label(self) -> str:
        index = "?" if self.index is None else str(self.index)
        return index if self.mig_instance is None else f"{index}/{self.mig_instance}"


@dataclass(frozen=True)
class AttemptTotals:
    job_id: int
    attempt: int
    kind: str
    name: str | None
    user: str | None
    tags: Mapping[str, str]
    first_at: float
    last_at: float
    peak_gpu_mem_bytes: int | None
    usage: AttemptUsage


def window_parts(since: float, until: float) -> list[tuple[str, str, float, float]]:
    """(table, key column, from, to) covering [since, until): whole hours inside, minutes at the ends."""
    first_hour = math.ceil(since / HOUR) * HOUR
    last_hour = math.floor(until / HOUR) * HOUR
    if first_hour >= last_hour:
        return [("gpu_minutes", "minute", since, until)]
    return [
        ("gpu_minutes", "minute", since, first_hour),
        ("gpu_hours", "hour", first_hour, last_hour),
        ("gpu_minutes", "minute", last_hour, until),
    ]


def gpus(store: LedgerStore) -> dict[int, GpuInfo]:
    rows = store.rows("SELECT id, uuid, gpu_index, name, mig_instance, mig_parent, last_at FROM gpus")
    return {r[0]: GpuInfo(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6]) for r in rows}


def gpu_usage(store: LedgerStore, since: float, until: float) -> dict[int, GpuUsage]:
    totals: dict[int, GpuUsage] = {}
    for table, key, lo, hi in window_parts(since, until):
        if lo >= hi:
            continue
        if table == "gpu_hours":  # whole hours, all inside
            sums, starts = GPU_COLUMNS.sums(), f"{key} >= :lo"
        else:  # every minute that overlaps [lo, hi), by the share of it inside
            sums = GPU_COLUMNS.sums(weight=f"(MIN({key} + {MINUTE}, :hi) - MAX({key}, :lo)) / {float(MINUTE)}")
            starts = f"{key} > :lo - {MINUTE}"
        sql = f"SELECT gpu, {sums} FROM {table} WHERE {starts} AND {key} < :hi GROUP BY gpu"
        for row in store.rows(sql, {"lo": lo, "hi": hi}):
            usage = GPU_COLUMNS.usage(row, 1)
            totals[row[0]] = totals[row[0]].plus(usage) if row[0] in totals else usage
    return totals


def gpu_totals(store: LedgerStore) -> dict[int, GpuUsage]:
    """Each GPU's usage over every hour kept, whatever the clock says now (it may have been set back)."""
    rows = store.rows(f"SELECT gpu, {GPU_COLUMNS.sums()} FROM gpu_hours GROUP BY gpu")
    return {row[0]: GPU_COLUMNS.usage(row, 1) for row in rows}


def gap_seconds(store: LedgerStore, since: float, until: float, now: float) -> dict[int, float]:
    """Gap seconds per GPU inside the window, with the time since recording stopped, if it has."""
    rows = store.rows(
        "SELECT gpu, SUM(MIN(ended_at, ?) - MAX(started_at, ?)) FROM gaps"
        " WHERE ended_at > ? AND started_at < ? GROUP BY gpu",
        (until, since, since, until),
    )
    gaps = {gpu: float(seconds) for gpu, seconds in rows}
    meta = store.meta()
    last = meta.get("last_sample_at")
    if last is None or now - last <= meta.get("stale_after_s", 0.0):
        return gaps
    # Recording has stopped: GPUs sampled until then are in an open gap, not gone from the box.
    present = last - meta.get("max_gap_s", 0.0)
    for info in gpus(store).values():
        if info.last_at is not None and info.last_at >= present:
            start, end = max(info.last_at, since), min(until, now)
            if end > start:
                gaps[info.id] = gaps.get(info.id, 0.0) + end - start
    return gaps


def attempt_usage(store: LedgerStore, since: float, until: float) -> list[AttemptTotals]:
    rows = store.rows(
        "SELECT a.job_id, a.attempt, a.kind, a.name, a.user, a.tags, a.first_at, a.last_at, a.peak_gpu_mem_bytes, "
        f"{ATTEMPT_COLUMNS.sums('h.')} FROM attempt_hours h JOIN attempts a ON a.job_id = h.job_id "
        "AND a.attempt = h.attempt WHERE h.hour > ? AND h.hour < ? GROUP BY h.job_id, h.attempt",
        (since - HOUR, until),
    )
    return [
        AttemptTotals(
            job_id=r[0],
            attempt=r[1],
            kind=r[2],
            name=r[3],
            user=r[4],
            tags=tags_of(r[5]),
            first_at=r[6],
            last_at=r[7],
            peak_gpu_mem_bytes=r[8],
            usage=ATTEMPT_COLUMNS.usage(r, 9),
        )
        for r in rows
    ]


def unqueued_by_user(store: LedgerStore, since: float, until: float) -> dict[str | None, UnqueuedUsage]:
    rows = store.rows(
        f"SELECT user, {UNQUEUED_COLUMNS.sums()} FROM unqueued_hours WHERE hour > ? AND hour < ? GROUP BY user",
        (since - HOUR, until),
    )
    return {(r[0] or None): UNQUEUED_COLUMNS.usage(r, 1) for r in rows}


def unallocated_hours(store: LedgerStore, since: float, until: float) -> list[tuple[int, float]]:
    """(hour, GPU-seconds observed but neither allocated nor used outside the queue), most first.
    MIG parents are left out: their instances are what jobs are given."""
    rows = store.rows(
        "SELECT h.hour, SUM(MAX(h.observed_ms - h.allocated_ms - h.unqueued_ms, 0)) AS free FROM gpu_hours h"
        " JOIN gpus g ON g.id = h.gpu WHERE g.mig_parent = 0 AND h.hour > ? AND h.hour < ?"
        " GROUP BY h.hour HAVING free > 0 ORDER BY free DESC, h.hour DESC",
        (since - HOUR, until),
    )
    return [(hour, free / 1000.0) for hour, free in rows]


def unallocated_gpus(store: LedgerStore, hour: int) -> list[int]:
    """The GPUs (row ids) that sat unallocated for at least half of what was observed of `hour`."""
    rows = store.rows(
        "SELECT h.gpu FROM gpu_hours h JOIN gpus g ON g.id = h.gpu WHERE h.hour = ? AND g.mig_parent = 0"
        " AND 2 * (h.observed_ms - h.allocated_ms - h.unqueued_ms) >= h.observed_ms AND h.observed_ms > 0",
        (hour,),
    )
    return [r[0] for r in rows]
