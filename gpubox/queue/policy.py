"""The placement policy: one pure function from queue state, GPU state and now to decisions.

Pending jobs are ranked by priority (higher first), then kind, then submission time, then id.
GPUs are exclusive unless both jobs share; a GPU qualifies when it is not paused, not held and
has the free memory asked for (memory held outside the queue counts). Order is strict: a job
never starts ahead of a higher-ranked GPU job that cannot start on any GPU that job could ever
use (the ones it named, or those with the memory it asks for in total): a job on other GPUs
delays it in no way, so a GPU paused for maintenance, or held by a process outside the queue,
holds up only the jobs that need that GPU. Otherwise only backfill passes it, allowed only when
the lower job's time limit ends before the blocked job could possibly start. A blocked job's
earliest start is known only when everything keeping it out is a queue job with a known end; a
paused GPU, memory held elsewhere, or a job without a time limit makes it unknown, and then
nothing passes it on its GPUs. Jobs that can never start on this box do not hold the queue.
CPU-only jobs have their own slots and their own line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpubox.format import span
from gpubox.queue.jobs import KINDS

GIB = 1 << 30


@dataclass(frozen=True)
class JobRequest:
    id: int
    kind: str
    priority: int
    submitted_at: float
    gpus: int
    gpu_ids: tuple[str, ...] | None = None
    gpu_mem_bytes: int | None = None
    time_limit_s: float | None = None
    share: bool = False


@dataclass(frozen=True)
class RunningJob:
    id: int
    kind: str
    gpu_uuids: tuple[str, ...]
    ends_by: float | None
    share: bool = False
    gpu_mem_bytes: int | None = None  # what it asked for on each GPU


@dataclass(frozen=True)
class GpuState:
    uuid: str
    index: int
    mem_total_bytes: int
    mem_used_bytes: int
    paused: bool = False
    # Of mem_used_bytes, what each running queue job's processes use here, as (job id, bytes):
    # stopping a job frees its share and no more. None: not known (only preemption asks).
    mem_by_job: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class PolicyConfig:
    kind_order: tuple[str, ...] = field(default=KINDS)
    max_cpu_jobs: int = 1
    backfill: bool = True


@dataclass(frozen=True)
class Start:
    job_id: int
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    job_id: int
    reason: str


@dataclass(frozen=True)
class _Blocked:
    """A job that waits ahead of the rest: for GPUs, or behind such a job."""

    job: JobRequest
    earliest: float | None  # the soonest it could start, when known
    wants: frozenset[str]  # the GPUs it could start on: only a job that takes one of them delays it


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _job_name(job: RunningJob) -> str:
    return f"job {job.id} ({job.kind})"


def _rank(job: JobRequest, config: PolicyConfig) -> tuple[int, int, float, int]:
    order = config.kind_order
    kind = order.index(job.kind) if job.kind in order else len(order)
    return (-job.priority, kind, job.submitted_at, job.id)


def _gpu_count(job: JobRequest) -> int:
    return len(job.gpu_ids) if job.gpu_ids is not None else job.gpus


class _Board:
    """GPU holdings during one pass; starts made in the pass are added as they happen."""

    def __init__(self, running: Sequence[RunningJob], gpus: Sequence[GpuState]) -> None:
        self.gpus = sorted(gpus, key=lambda g: g.index)
        self.by_uuid = {g.uuid: g for g in self.gpus}
        self.holders: dict[str, list[RunningJob]] = {g.uuid: [] for g in self.gpus}
        self.reserved: dict[str, int] = {g.uuid: 0 for g in self.gpus}  # by jobs started in this pass
        declared: dict[str, int] = {g.uuid: 0 for g in self.gpus}
        for job in running:
            for uuid in job.gpu_uuids:
                if uuid in self.holders:
                    self.holders[uuid].append(job)
                    declared[uuid] += job.gpu_mem_bytes or 0
        # A running job may not have allocated what it asked for yet (CUDA start-up, loading a
        # model): a GPU counts as using at least what its running jobs asked for.
        self.unallocated = {g.uuid: max(0, declared[g.uuid] - g.mem_used_bytes) for g in self.gpus}

    def free(self, gpu: GpuState) -> int:
        return gpu.mem_total_bytes - gpu.mem_used_bytes - self.unallocated[gpu.uuid] - self.reserved[gpu.uuid]

    def blockers(self, gpu: GpuState, job: JobRequest) -> list[RunningJob]:
        return [h for h in self.holders[gpu.uuid] if not (job.share and h.share)]

    def problem(self, gpu: GpuState, job: JobRequest) -> str | None:
        if gpu.paused:
            return f"GPU {gpu.index} is paused"
        held = self.blockers(gpu, job)
        if held:
            return f"GPU {gpu.index} held by " + " and ".join(_job_name(h) for h in held)
        need = job.gpu_mem_bytes
        if need is not None and self.free(gpu) < need:
            return f"GPU {gpu.index} has {gib(max(self.free(gpu), 0))} free"
        return None

    def take(self, job: JobRequest, uuids: tuple[str, ...], now: float) -> None:
        ends = now + job.time_limit_s if job.time_limit_s is not None else None
        held = RunningJob(job.id, job.kind, uuids, ends, job.share, job.gpu_mem_bytes)
        for uuid in uuids:
            self.holders[uuid].append(held)
            self.reserved[uuid] += job.gpu_mem_bytes or 0


def _impossible(job: JobRequest, board: _Board) -> str | None:
    """Why the job can never start on this box, or None."""
    need = job.gpu_mem_bytes
    if job.gpu_ids is not None:
        for uuid in job.gpu_ids:
            if uuid not in board.by_uuid:
                return f"no GPU {uuid} on this box"
        for uuid in job.gpu_ids:
            gpu = board.by_uuid[uuid]
            if need is not None and gpu.mem_total_bytes < need:
                return f"GPU {gpu.index} has only {gib(gpu.mem_total_bytes)} in total, job needs {gib(need)}"
        return None
    if job.gpus > len(board.gpus):
        plural = "GPU" if len(board.gpus) == 1 else "GPUs"
        return f"needs {job.gpus} GPUs; this box has {len(board.gpus)} {plural}"
    if need is not None:
        big = [g for g in board.gpus if g.mem_total_bytes >= need]
        if len(big) < job.gpus:
            if not big:
                return f"no GPU on this box has {gib(need)}"
            return f"needs {job.gpus} GPUs with {gib(need)}; only {len(big)} on this box have that much"
    return None


def _candidates(job: JobRequest, board: _Board) -> list[GpuState]:
    if job.gpu_ids is not None:
        return sorted((board.by_uuid[u] for u in job.gpu_ids), key=lambda g: g.index)
    need = job.gpu_mem_bytes
    return [g for g in board.gpus if need is None or g.mem_total_bytes >= need]


def _need_text(job: JobRequest, board: _Board) -> str:
    if job.gpu_ids is not None:
        names = ", ".join(str(board.by_uuid[u].index) for u in job.gpu_ids)
        what = f"GPU {names}" if len(job.gpu_ids) == 1 else f"GPUs {names}"
    else:
        what = f"{job.gpus} GPU" if job.gpus == 1 else f"{job.gpus} GPUs"
    if job.gpu_mem_bytes is not None:
        what += f" with {gib(job.gpu_mem_bytes)} free"
    return f"needs {what}"


def _free_at(gpu: GpuState, job: JobRequest, board: _Board) -> float | None:
    """When the GPU is free of what keeps the job off it now (every job on it that it may not
    share with has ended, as their time limits say); None when that has no known time: a paused
    GPU, memory held outside the queue, a job on it without a time limit."""
    held = board.blockers(gpu, job)
    if gpu.paused or not held or any(h.ends_by is None for h in held):
        return None
    return max(h.ends_by for h in held if h.ends_by is not None)


def _earliest(job: JobRequest, board: _Board, now: float) -> float | None:
    """The soonest a blocked job could start: when as many of its GPUs as it needs are free (a
    GPU with no known time could be free at any moment); None when that is not known."""
    times: list[tuple[float, bool]] = []  # (when, known)
    for gpu in _candidates(job, board):
        if board.problem(gpu, job) is None:
            times.append((now, True))
        else:
            free = _free_at(gpu, job, board)
            times.append((now, False) if free is None else (free, True))
    times.sort(key=lambda t: (t[0], not t[1]))
    when, known = times[_gpu_count(job) - 1]
    return when if known else None


def _sooner_elsewhere(job: JobRequest, busy: Sequence[GpuState], board: _Board) -> float | None:
    """The soonest one of the job's busy GPUs frees up (which could let it start on GPUs nobody
    ahead wants); inf when none is busy, None when one of them has no known time."""
    frees = [_free_at(g, job, board) for g in busy]
    if any(f is None for f in frees):
        return None
    return min((f for f in frees if f is not None), default=math.inf)


def _wanting(blocked: list[_Blocked], uuids: set[str]) -> list[_Blocked]:
    """The jobs waiting ahead that could start on one of these GPUs."""
    return [b for b in blocked if b.wants & uuids]


def _behind(job: JobRequest, blocked: list[_Blocked], now: float, config: PolicyConfig) -> tuple[_Blocked, str] | None:
    """The first blocked job ahead that the job may not pass, and why; None when it may backfill."""
    for b in blocked:
        ahead = "higher priority" if b.job.priority > job.priority else "ahead in the queue"
        head = f"waits behind job {b.job.id} ({ahead})"
        if not config.backfill:
            return b, head
        if job.time_limit_s is None:
            return b, f"{head}; only a job with a time limit can start ahead"
        if b.earliest is None:
            return b, f"{head}; when job {b.job.id} can start is not known"
        if now + job.time_limit_s > b.earliest:
            return b, (
                f"{head}; its time limit of {span(job.time_limit_s)} ends after job {b.job.id} "
                f"could start (in {span(math.ceil(max(b.earliest - now, 0)))})"
            )
    return None


def place_jobs(
    pending: Sequence[JobRequest],
    running: Sequence[RunningJob],
    gpus: Sequence[GpuState],
    now: float,
    config: PolicyConfig = PolicyConfig(),
) -> tuple[list[Start], list[Wait]]:
    """Decide which pending jobs start now and on which GPUs; every other job gets a reason."""
    board = _Board(running, gpus)
    cpu_jobs = [j.id for j in running if not j.gpu_uuids]
    starts: list[Start] = []
    waits: list[Wait] = []
    blocked: list[_Blocked] = []
    wanted: set[str] = set()  # every GPU a job that waits ahead could ever start on
    for job in sorted(pending, key=lambda j: _rank(j, config)):
        if _gpu_count(job) == 0:
            if len(cpu_jobs) < config.max_cpu_jobs:
                cpu_jobs.append(job.id)
                starts.append(Start(job.id, ()))
            else:
                names = ", ".join(f"job {i}" for i in cpu_jobs)
                if config.max_cpu_jobs == 0:
                    waits.append(Wait(job.id, "CPU-only jobs do not run here: queue.max_cpu_jobs is 0"))
                else:
                    detail = f" ({names})" if names else ""
                    waits.append(Wait(job.id, f"waits for a CPU-only slot: {config.max_cpu_jobs} in use{detail}"))
            continue
        never = _impossible(job, board)
        if never is not None:
            waits.append(Wait(job.id, never))
            continue
        candidates = _candidates(job, board)
        problems = [(g, board.problem(g, job)) for g in candidates]
        fit = [g for g, p in problems if p is None]
        if len(fit) < _gpu_count(job):
            reasons = ", ".join(p for _, p in problems if p is not None)
            waits.append(Wait(job.id, f"{_need_text(job, board)}: {reasons}"))
            blocked.append(_Blocked(job, _earliest(job, board, now), frozenset(g.uuid for g in candidates)))
            wanted.update(g.uuid for g in candidates)
            continue
        # GPUs no job waiting ahead could ever use first: taking them delays none of those jobs.
        aside = [g for g in fit if g.uuid not in wanted]
        others = [g for g in fit if g.uuid in wanted]
        passing: list[GpuState] = []
        if others and (job.gpu_ids is not None or len(aside) < job.gpus):
            # Then GPUs whose waiting jobs it may pass (it ends before any of them could start):
            # only the jobs ahead that could start on a GPU it takes can be delayed by it.
            passing = [g for g in others if _behind(job, _wanting(blocked, {g.uuid}), now, config) is None]
        rest = [g for g in others if g not in passing]
        if job.share:  # a GPU nobody uses before one it would share: co-located only when it must be
            aside, passing, rest = (
                sorted(group, key=lambda g: len(board.holders[g.uuid])) for group in (aside, passing, rest)
            )
        fit = aside + passing + rest
        if job.gpu_ids is None:
            fit = fit[: job.gpus]
        taken = {g.uuid for g in fit if g in rest}
        if taken:
            refused = _behind(job, _wanting(blocked, taken), now, config)
            assert refused is not None  # a GPU in `rest` has a job that refuses it
            waits.append(Wait(job.id, refused[1]))
            # The soonest it could start: when one of the jobs that keep it off its GPUs could,
            # or when one of its busy GPUs frees up (it may then start on GPUs nobody ahead
            # wants). A job further back that takes its GPUs must end before then.
            ahead = [b.earliest for b in _wanting(blocked, {g.uuid for g in rest})]
            busy = _sooner_elsewhere(job, [g for g, p in problems if p is not None], board)
            soonest = None if busy is None or None in ahead else min([busy, *(a for a in ahead if a is not None)])
            blocked.append(_Blocked(job, soonest, frozenset(g.uuid for g in candidates)))
            wanted.update(g.uuid for g in candidates)
            continue
        uuids = tuple(sorted((g.uuid for g in fit), key=lambda u: board.by_uuid[u].index))
        board.take(job, uuids, now)
        starts.append(Start(job.id, uuids))
    return starts, waits
