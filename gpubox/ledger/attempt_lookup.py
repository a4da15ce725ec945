"""One queue job's GPU use, summed over its recorded attempts: the line `gpubox queue show` adds.

Read-only: a job the ledger never saw, or a box with no ledger yet, has no usage (None), which
is not the same as a usage of zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpubox.ledger.rollup import HOUR
from gpubox.ledger.schema import ATTEMPT_COLUMNS
from gpubox.ledger.store import LedgerStore, ledger_exists, ledger_path
from gpubox.ledger.usage import busy_source_name

_H = 3600.0
_KWH = 3.6e6


@dataclass(frozen=True)
class JobUsage:
    """GPU-hours over every recorded attempt of one job; null where the figure was never known."""

    job_id: int
    attempts: int  # attempts the ledger recorded
    first_at: float
    last_at: float
    allocated_gpu_hours: float
    busy_gpu_hours: float | None
    busy_share: float | None  # busy over the allocated time whose busy is known (0..1)
    busy_source: str | None
    idle_allocated_gpu_hours: float | None
    starved_gpu_hours: float | None
    energy_kwh: float | None
    energy_estimated_kwh: float | None
    peak_gpu_mem_bytes: int | None


def job_usage(store: LedgerStore, job_id: int) -> JobUsage | None:
    """The job's usage, or None when the ledger recorded no attempt of it."""
    with store.reading():
        [(count, first_at, last_at, peak)] = store.rows(
            "SELECT COUNT(*), MIN(first_at), MAX(last_at), MAX(peak_gpu_mem_bytes) FROM attempts WHERE job_id = ?",
            (job_id,),
        )
        if not count:
            return None
        # the hour range keeps this a range scan of the primary key, not a scan of every job's hours
        [row] = store.rows(
            f"SELECT {ATTEMPT_COLUMNS.sums()} FROM attempt_hours WHERE hour > ? AND hour <= ? AND job_id = ?",
            (first_at - HOUR, last_at, job_id),
        )
    u = ATTEMPT_COLUMNS.usage(row)
    return JobUsage(
        job_id=job_id,
        attempts=count,
        first_at=first_at,
        last_at=last_at,
        allocated_gpu_hours=u.allocated_s / _H,
        busy_gpu_hours=u.busy_s / _H if u.busy_known_s else None,
        busy_share=u.busy_s / u.busy_known_s if u.busy_known_s else None,
        busy_source=busy_source_name(u.busy_source),
        idle_allocated_gpu_hours=u.idle_allocated_s / _H if u.busy_known_s else None,
        starved_gpu_hours=u.starved_s / _H if u.loader_known_s else None,
        energy_kwh=u.energy_j / _KWH if u.energy_known_s else None,
        energy_estimated_kwh=u.energy_estimated_j / _KWH if u.energy_known_s else None,
        peak_gpu_mem_bytes=peak,
    )


def recorded_job_usage(job_id: int, path: Path | None = None) -> JobUsage | None:
    """The job's usage from the ledger under the state directory; None when there is no ledger
    yet. Raises LedgerError when there is one that cannot be read."""
    path = ledger_path() if path is None else path
    if not ledger_exists(path):
        return None
    with LedgerStore(path, create=False) as store:
        return job_usage(store, job_id)
