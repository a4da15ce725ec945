"""Plain values for the pure placement and preemption tests: GPUs, waiting jobs, running jobs."""

from __future__ import annotations

from gpubox.queue.policy import GpuState, JobRequest, RunningJob

GIB = 1 << 30


def gpu(
    index: int,
    total_gib: int = 80,
    used_gib: float = 0,
    paused: bool = False,
    by_job_gib: dict[int, float] | None = None,
) -> GpuState:
    """`by_job_gib`: what each queue job's processes use of `used_gib` (None: not known)."""
    by_job = None if by_job_gib is None else tuple((j, int(g * GIB)) for j, g in sorted(by_job_gib.items()))
    return GpuState(f"GPU-{index}", index, total_gib * GIB, int(used_gib * GIB), paused, by_job)


def job(
    id: int,
    kind: str = "train",
    priority: int = 0,
    at: float = 0.0,
    gpus: int = 1,
    ids: tuple[str, ...] | None = None,
    mem_gib: float | None = None,
    limit: float | None = None,
    share: bool = False,
) -> JobRequest:
    mem = int(mem_gib * GIB) if mem_gib is not None else None
    return JobRequest(id, kind, priority, at, gpus, ids, mem, limit, share)


def run(
    id: int,
    *uuids: str,
    kind: str = "train",
    ends_by: float | None = None,
    share: bool = False,
    mem_gib: int | None = None,
) -> RunningJob:
    return RunningJob(id, kind, uuids, ends_by, share, mem_gib * GIB if mem_gib is not None else None)
