"""Plain values for the pure placement and preemption tests: GPUs, waiting jobs, running jobs."""

from __future__ import annotations

from gpubox.queue.policy import GpuState, JobRequest, RunningJob

GIB = 1 << 30


def gpu(
    index: int, total_gib: int = 80, used_gib: float = 0, paused: bool = False, foreign_gib: float | None = None
) -> GpuState:
    foreign = None if foreign_gib is None else int(foreign_gib * GIB)
    return GpuState(f"GPU-{index}", index, total_gib * GIB, int(used_gib * GIB), paused, foreign)


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
