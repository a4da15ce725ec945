"""Increments waiting to be written: per GPU per minute, per attempt per hour, unqueued per user
per hour, gaps, and the GPUs' latest marks, gathered in memory and handed to the store as one
`Batch` (one transaction). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpubox.ledger.accounting import Allocation, AttemptKey, Gap, GpuMark, IntervalUsage, split_periods
from gpubox.ledger.usage import AttemptUsage, GpuUsage, UnqueuedUsage

MINUTE = 60
HOUR = 3600


@dataclass(frozen=True)
class GpuSeen:
    """A GPU as last sampled: who it is, and its mark (where the next interval starts)."""

    uuid: str
    index: int | None
    name: str | None
    mig_instance: int | None
    mig_parent: bool  # a GPU in MIG mode: its instances carry the work, it carries the calendar
    mark: GpuMark | None


@dataclass(frozen=True)
class AttemptSeen:
    """A job attempt as seen so far: its description, when, and its peak memory on one GPU."""

    allocation: Allocation
    first_at: float
    last_at: float
    peak_gpu_mem_bytes: int | None


@dataclass(frozen=True)
class Batch:
    """Everything one write adds, keyed as the store keys it."""

    gpu_minutes: Mapping[tuple[str, int], GpuUsage]  # (uuid, minute start)
    attempt_hours: Mapping[tuple[int, int, int], AttemptUsage]  # (job id, attempt, hour start)
    attempts: Mapping[AttemptKey, AttemptSeen]
    unqueued_hours: Mapping[tuple[str, int, str | None], UnqueuedUsage]  # (uuid, hour start, user)
    gaps: tuple[Gap, ...]
    gpus: Mapping[str, GpuSeen]
    last_sample_at: float | None
    meta: Mapping[str, float]  # settings a report needs to read the rest (max gap, staleness)
    wait_peaks: Mapping[int, int] = field(default_factory=dict)  # hour start -> most jobs waiting at once
    wait_reasons: Mapping[tuple[int, str], float] = field(default_factory=dict)  # (hour, reason) -> job-seconds
    wait_free: Mapping[tuple[str, int], float] = field(default_factory=dict)  # (uuid, hour) -> free while jobs waited

    @property
    def empty(self) -> bool:
        return not (
            self.gpu_minutes or self.attempts or self.gaps or self.gpus or self.unqueued_hours or self.wait_peaks
        )


class Rollup:
    """The pending increments; `batch()` hands a copy over, `clear()` empties it once written."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._gpu_minutes: dict[tuple[str, int], GpuUsage] = {}
        self._attempt_hours: dict[tuple[int, int, int], AttemptUsage] = {}
        self._attempts: dict[AttemptKey, AttemptSeen] = {}
        self._unqueued: dict[tuple[str, int, str | None], UnqueuedUsage] = {}
        self._gaps: list[Gap] = []
        self._gpus: dict[str, GpuSeen] = {}
        self._last_sample_at: float | None = None
        self._wait_peaks: dict[int, int] = {}
        self._wait_reasons: dict[tuple[int, str], float] = {}
        self._wait_free: dict[tuple[str, int], float] = {}

    def add_waits(self, start: float, end: float, reasons: Mapping[str, int], free: Iterable[str] = ()) -> None:
        """Jobs waiting from `start` to `end`, counted by reason (job-seconds per hour and reason),
        and the GPUs (UUIDs) that sat unallocated meanwhile."""
        jobs = sum(reasons.values())
        if not jobs:
            return  # an hour with nothing waiting has no row
        free = tuple(free)
        for hour, part in split_periods(start, end, HOUR):
            self._wait_peaks[hour] = max(self._wait_peaks.get(hour, 0), jobs)
            for reason, count in reasons.items():
                key = (hour, reason)
                self._wait_reasons[key] = self._wait_reasons.get(key, 0.0) + part * count
            for uuid in free:
                self._wait_free[(uuid, hour)] = self._wait_free.get((uuid, hour), 0.0) + part

    def add(self, interval: IntervalUsage) -> None:
        seconds = interval.end - interval.start
        for minute, part in split_periods(interval.start, interval.end, MINUTE):
            key = (interval.uuid, minute)
            piece = interval.gpu.scaled(part / seconds)
            self._gpu_minutes[key] = self._gpu_minutes[key].plus(piece) if key in self._gpu_minutes else piece
        hours = split_periods(interval.start, interval.end, HOUR)
        for a in interval.attempts:
            self._see_attempt(a.allocation, interval.start, interval.end, a.gpu_mem_bytes)
            for hour, part in hours:
                akey = (a.allocation.job_id, a.allocation.attempt, hour)
                usage = a.usage.scaled(part / seconds)
                self._attempt_hours[akey] = (
                    self._attempt_hours[akey].plus(usage) if akey in self._attempt_hours else usage
                )
        for user, unqueued in interval.unqueued:
            for hour, part in hours:
                ukey = (interval.uuid, hour, user)
                usage_u = unqueued.scaled(part / seconds)
                self._unqueued[ukey] = self._unqueued[ukey].plus(usage_u) if ukey in self._unqueued else usage_u

    def add_gap(self, gap: Gap) -> None:
        self._gaps.append(gap)

    def see_gpu(self, seen: GpuSeen) -> None:
        self._gpus[seen.uuid] = seen
        if seen.mark is not None:
            last = self._last_sample_at
            self._last_sample_at = seen.mark.taken_at if last is None else max(last, seen.mark.taken_at)

    def batch(self, meta: Mapping[str, float]) -> Batch:
        return Batch(
            gpu_minutes=dict(self._gpu_minutes),
            attempt_hours=dict(self._attempt_hours),
            attempts=dict(self._attempts),
            unqueued_hours=dict(self._unqueued),
            gaps=tuple(self._gaps),
            gpus=dict(self._gpus),
            last_sample_at=self._last_sample_at,
            meta=dict(meta),
            wait_peaks=dict(self._wait_peaks),
            wait_reasons=dict(self._wait_reasons),
            wait_free=dict(self._wait_free),
        )

    def _see_attempt(self, allocation: Allocation, start: float, end: float, memory: int | None) -> None:
        seen = self._attempts.get(allocation.key)
        if seen is None:
            self._attempts[allocation.key] = AttemptSeen(allocation, start, end, memory)
            return
        peak = seen.peak_gpu_mem_bytes
        if memory is not None:
            peak = memory if peak is None else max(peak, memory)
        # the queue's latest description of the attempt is the one kept
        self._attempts[allocation.key] = replace(
            seen,
            allocation=allocation,
            first_at=min(seen.first_at, start),
            last_at=max(seen.last_at, end),
            peak_gpu_mem_bytes=peak,
        )
