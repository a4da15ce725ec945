"""Findings that pay: the attempts that held GPUs idle longest, the most starved attempts, and the
hours when GPUs sat unallocated while jobs waited.

Who waited, and which GPUs sat free meanwhile, is the queue's to say: a `WaitHistory` passed to the
report answers it (`StoredWaits`: what the daemon recorded, sample by sample), and then only time
when a GPU was free while some job waited counts. Without one, the hours are ranked by unallocated
GPU-hours and their `jobs_waiting` and `wait_reasons` are null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpubox.digits import ascii_int
from gpubox.ledger.queries import (
    AttemptTotals,
    GpuInfo,
    free_gpus_while_waiting,
    free_while_waiting,
    unallocated_gpus,
    unallocated_hours,
)
from gpubox.ledger.rollup import HOUR
from gpubox.ledger.store import LedgerStore

_H = 3600.0
# A handover between two jobs leaves a GPU free for a sample or two while the next one is started;
# a minute of GPU time in an hour is where a free GPU beside waiting jobs is worth a look.
FREE_WHILE_WAITING_MIN_S = 60.0


@dataclass(frozen=True)
class WaitSummary:
    """Jobs that waited in the queue during an hour, and why (the queue's own words)."""

    jobs_waiting: int
    wait_reasons: tuple[str, ...]


class WaitHistory(Protocol):
    """The hook for the queue: who waited during [start, end), or None when nothing waited; and per
    hour, the GPU-seconds and GPUs (row ids) that sat unallocated while some job waited, most first."""

    def waiting_during(self, start: float, end: float) -> WaitSummary | None: ...

    def free_while_waiting(self, since: float, until: float) -> Sequence[tuple[int, float, Sequence[int]]]: ...


class StoredWaits:
    """The waits the daemon recorded in the ledger: the most jobs waiting at once during the hour,
    and the reasons that held the most job-time, most first."""

    def __init__(self, store: LedgerStore, reasons: int = 3) -> None:
        self.store, self.reasons = store, reasons

    def waiting_during(self, start: float, end: float) -> WaitSummary | None:
        [(peak,)] = self.store.rows("SELECT MAX(peak_jobs) FROM wait_hours WHERE hour >= ? AND hour < ?", (start, end))
        if not peak:
            return None
        rows = self.store.rows(
            "SELECT reason FROM wait_reasons WHERE hour >= ? AND hour < ? GROUP BY reason"
            " ORDER BY SUM(job_ms) DESC, reason LIMIT ?",
            (start, end, self.reasons),
        )
        return WaitSummary(int(peak), tuple(str(r[0]) for r in rows))

    def free_while_waiting(self, since: float, until: float) -> list[tuple[int, float, Sequence[int]]]:
        least = FREE_WHILE_WAITING_MIN_S
        return [
            (hour, seconds, free_gpus_while_waiting(self.store, hour, least))
            for hour, seconds in free_while_waiting(self.store, since, until, least)
        ]


@dataclass(frozen=True)
class AttemptFinding:
    job_id: int
    attempt: int
    name: str | None
    kind: str
    user: str | None
    tags: Mapping[str, str]
    first_at: float
    last_at: float
    allocated_gpu_hours: float
    busy_gpu_hours: float | None
    idle_allocated_gpu_hours: float | None
    starved_gpu_hours: float | None
    peak_gpu_mem_bytes: int | None


@dataclass(frozen=True)
class UnallocatedHour:
    hour_start: float
    unallocated_gpu_hours: float  # observed, neither held by a job nor used outside the queue (while jobs waited)
    gpus: tuple[str, ...]  # the GPUs free while jobs waited for a minute or more (no WaitHistory: half the hour)
    jobs_waiting: int | None  # null without a WaitHistory
    wait_reasons: tuple[str, ...] | None


def attempt_finding(a: AttemptTotals) -> AttemptFinding:
    u = a.usage
    return AttemptFinding(
        job_id=a.job_id,
        attempt=a.attempt,
        name=a.name,
        kind=a.kind,
        user=a.user,
        tags=dict(a.tags),
        first_at=a.first_at,
        last_at=a.last_at,
        allocated_gpu_hours=u.allocated_s / _H,
        busy_gpu_hours=u.busy_s / _H if u.busy_known_s else None,
        idle_allocated_gpu_hours=u.idle_allocated_s / _H if u.busy_known_s else None,
        starved_gpu_hours=u.starved_s / _H if u.loader_known_s else None,
        peak_gpu_mem_bytes=a.peak_gpu_mem_bytes,
    )


def top_attempts(
    attempts: Sequence[AttemptTotals], seconds: Callable[[AttemptTotals], float], limit: int
) -> tuple[AttemptFinding, ...]:
    """The `limit` attempts with the most `seconds` (more than none), most first."""
    ranked = sorted((a for a in attempts if seconds(a) > 0), key=lambda a: (-seconds(a), a.job_id, a.attempt))
    return tuple(attempt_finding(a) for a in ranked[:limit])


def idle_attempts(attempts: Sequence[AttemptTotals], limit: int) -> tuple[AttemptFinding, ...]:
    return top_attempts(attempts, lambda a: a.usage.idle_allocated_s, limit)


def starved_attempts(attempts: Sequence[AttemptTotals], limit: int) -> tuple[AttemptFinding, ...]:
    return top_attempts(attempts, lambda a: a.usage.starved_s, limit)


def free_hours(
    store: LedgerStore,
    since: float,
    until: float,
    gpus: Mapping[int, GpuInfo],
    limit: int,
    waits: WaitHistory | None = None,
) -> tuple[UnallocatedHour, ...]:
    found: list[UnallocatedHour] = []
    ranked: list[tuple[int, float, Sequence[int]]]
    if waits is None:
        ranked = [
            (hour, seconds, unallocated_gpus(store, hour)) for hour, seconds in unallocated_hours(store, since, until)
        ]
    else:
        ranked = list(waits.free_while_waiting(since, until))
    for hour, seconds, gpu_ids in ranked:
        if len(found) >= limit:
            break
        waited = waits.waiting_during(hour, hour + HOUR) if waits is not None else None
        if waits is not None and waited is None:
            continue
        labels = tuple(sorted((gpus[g].label for g in gpu_ids if g in gpus), key=_label_order))
        found.append(
            UnallocatedHour(
                hour_start=float(hour),
                unallocated_gpu_hours=seconds / _H,
                gpus=labels,
                jobs_waiting=waited.jobs_waiting if waited is not None else None,
                wait_reasons=waited.wait_reasons if waited is not None else None,
            )
        )
    return tuple(found)


def _label_order(label: str) -> tuple[int, ...]:
    # A GPU without an index ("?") last, as the chart and the table place it.
    return tuple(n if (n := ascii_int(p)) is not None else 1 << 30 for p in label.split("/"))
