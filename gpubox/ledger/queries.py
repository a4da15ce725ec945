"""What a report reads from the ledger: sums over a window [since, until), in seconds.

Per-GPU figures come from whole hours where the window covers them and from minutes at its two
ends, so a report over a year reads some 9,000 rows per GPU rather than 525,600. An hour row holds
exactly the sum of its minute rows (the store adds it up from their integers), so where a window's
parts fall changes nothing, and the exporter, which adds up the hours, says the same. A minute the
window cuts counts for the part of it inside the window and not in a gap, up to what it observed,
so a GPU's observed time never exceeds the window; where retention dropped the minutes sooner than
the hours, an hour the window cuts counts the same way. Per-attempt and unqueued figures are kept
per hour: every hour that overlaps the window counts whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

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


Interval = tuple[float, float]


def gpu_usage(
    store: LedgerStore, since: float, until: float, gaps: Mapping[int, list[Interval]]
) -> dict[int, GpuUsage]:
    """Each GPU's usage over [since, until). A minute the window cuts counts for the time of it
    inside the window that was not a gap, at most all it observed, and its other figures by the
    same share; `gaps` are the GPUs' gaps (`gap_intervals`) over the window. Where retention
    dropped the minutes of an hour the window cuts, that hour's row counts the same way."""
    totals: dict[int, GpuUsage] = {}
    add = partial(_add, totals)
    for table, _key, lo, hi in window_parts(since, until):
        if table == "gpu_hours":
            sql = f"SELECT gpu, {GPU_COLUMNS.sums()} FROM gpu_hours WHERE hour >= ? AND hour < ? GROUP BY gpu"
            for row in store.rows(sql, (lo, hi)):
                add(row[0], GPU_COLUMNS.usage(row, 1))
            continue
        for hour in range(math.floor(lo / HOUR) * HOUR, math.ceil(hi / HOUR) * HOUR, HOUR):
            part = (max(lo, hour), min(hi, hour + HOUR))
            pruned = _hours_without_minutes(store, hour)
            for gpu, usage in pruned.items():
                _add_share(totals, gpu, usage, part, gaps)
            for gpu, usage in _minute_usage(store, part, gaps).items():
                if gpu not in pruned:
                    add(gpu, usage)
    return totals


def _minute_usage(store: LedgerStore, part: Interval, gaps: Mapping[int, list[Interval]]) -> dict[int, GpuUsage]:
    """Each GPU's usage over `part` (inside one hour) from its minute rows."""
    totals: dict[int, GpuUsage] = {}
    lo, hi = part
    whole_lo, whole_hi = _whole_minutes(lo, hi)
    if whole_lo < whole_hi:
        sql = f"SELECT gpu, {GPU_COLUMNS.sums()} FROM gpu_minutes WHERE minute >= ? AND minute < ? GROUP BY gpu"
        for row in store.rows(sql, (whole_lo, whole_hi)):
            _add(totals, row[0], GPU_COLUMNS.usage(row, 1))
    for minute in _cut_minutes(lo, hi):
        cut = (max(lo, minute), min(hi, minute + MINUTE))
        sql = f"SELECT gpu, {GPU_COLUMNS.sums()} FROM gpu_minutes WHERE minute = ? GROUP BY gpu"
        for row in store.rows(sql, (minute,)):
            _add_share(totals, row[0], GPU_COLUMNS.usage(row, 1), cut, gaps)
    return totals


def _hours_without_minutes(store: LedgerStore, hour: int) -> dict[int, GpuUsage]:
    """The hour rows at `hour` whose minutes retention dropped, in whole or in part: an hour row
    holds exactly the sum of its minute rows, so any shortfall is what was pruned."""
    rows = store.rows(
        f"SELECT gpu, {', '.join(GPU_COLUMNS.names)} FROM gpu_hours h WHERE hour = ? AND observed_ms >"
        " (SELECT COALESCE(SUM(m.observed_ms), 0) FROM gpu_minutes m"
        " WHERE m.minute >= h.hour AND m.minute < h.hour + ? AND m.gpu = h.gpu)",
        (hour, HOUR),
    )
    return {row[0]: GPU_COLUMNS.usage(row, 1) for row in rows}


def _add_share(
    totals: dict[int, GpuUsage], gpu: int, usage: GpuUsage, part: Interval, gaps: Mapping[int, list[Interval]]
) -> None:
    """Add a rollup the window cuts, for the time of `part` that was not a gap, at most all it observed."""
    if usage.observed_s > 0:
        inside = part[1] - part[0] - _overlap(part, gaps.get(gpu, []))
        _add(totals, gpu, usage.scaled(min(1.0, max(0.0, inside) / usage.observed_s)))


def _add(totals: dict[int, GpuUsage], gpu: int, usage: GpuUsage) -> None:
    totals[gpu] = totals[gpu].plus(usage) if gpu in totals else usage


def _whole_minutes(lo: float, hi: float) -> Interval:
    return math.ceil(lo / MINUTE) * MINUTE, math.floor(hi / MINUTE) * MINUTE


def _cut_minutes(lo: float, hi: float) -> list[int]:
    """The starts of the minutes that [lo, hi) covers only in part."""
    first, last = math.floor(lo / MINUTE) * MINUTE, math.floor(hi / MINUTE) * MINUTE
    if first == last:
        return [first]  # hi is inside the minute lo starts in
    return [m for m, cut in ((first, first < lo), (last, last < hi)) if cut]


def _overlap(part: Interval, intervals: list[Interval]) -> float:
    return sum(max(0.0, min(part[1], end) - max(part[0], start)) for start, end in intervals)


def first_hour(store: LedgerStore) -> float | None:
    """The start of the first hour the ledger keeps (older ones were pruned); None when empty."""
    [(first,)] = store.rows("SELECT MIN(hour) FROM gpu_hours")
    return None if first is None else float(first)


def gpu_totals(store: LedgerStore) -> dict[int, GpuUsage]:
    """Each GPU's usage since the ledger began: every hour kept, whatever the clock says now (it may
    have been set back), and what retention pruned."""
    totals: dict[int, GpuUsage] = {}
    for table in ("gpu_pruned", "gpu_hours"):
        for row in store.rows(f"SELECT gpu, {GPU_COLUMNS.sums()} FROM {table} GROUP BY gpu"):
            _add(totals, row[0], GPU_COLUMNS.usage(row, 1))
    return totals


def gap_intervals(store: LedgerStore, since: float, until: float, now: float) -> dict[int, list[Interval]]:
    """Each GPU's gaps inside the window, with the time since recording stopped, if it has."""
    rows = store.rows(
        "SELECT gpu, MAX(started_at, ?), MIN(ended_at, ?) FROM gaps WHERE ended_at > ? AND started_at < ?",
        (since, until, since, until),
    )
    gaps: dict[int, list[Interval]] = {}
    for gpu, start, end in rows:
        gaps.setdefault(gpu, []).append((float(start), float(end)))
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
                gaps.setdefault(info.id, []).append((start, end))
    return gaps


def gap_seconds(gaps: Mapping[int, list[Interval]]) -> dict[int, float]:
    return {gpu: sum(end - start for start, end in spans) for gpu, spans in gaps.items()}


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


def free_while_waiting(store: LedgerStore, since: float, until: float, least_s: float) -> list[tuple[int, float]]:
    """(hour, GPU-seconds that sat unallocated while some job waited), most first, from `least_s` up."""
    rows = store.rows(
        "SELECT hour, SUM(free_ms) AS free FROM wait_free WHERE hour > ? AND hour < ?"
        " GROUP BY hour HAVING free >= ? ORDER BY free DESC, hour DESC",
        (since - HOUR, until, 1000 * least_s),
    )
    return [(hour, free / 1000.0) for hour, free in rows]


def free_gpus_while_waiting(store: LedgerStore, hour: int, least_s: float) -> list[int]:
    """The GPUs (row ids) that sat unallocated for at least `least_s` while jobs waited in `hour`."""
    rows = store.rows("SELECT gpu FROM wait_free WHERE hour = ? AND free_ms >= ?", (hour, 1000 * least_s))
    return [r[0] for r in rows]


def unallocated_gpus(store: LedgerStore, hour: int) -> list[int]:
    """The GPUs (row ids) that sat unallocated for at least half of what was observed of `hour`."""
    rows = store.rows(
        "SELECT h.gpu FROM gpu_hours h JOIN gpus g ON g.id = h.gpu WHERE h.hour = ? AND g.mig_parent = 0"
        " AND 2 * (h.observed_ms - h.allocated_ms - h.unqueued_ms) >= h.observed_ms AND h.observed_ms > 0",
        (hour,),
    )
    return [r[0] for r in rows]
