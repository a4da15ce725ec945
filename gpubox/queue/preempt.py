"""Which running `batch` jobs to stop so that waiting `infer` jobs can start: one pure function.

The daemon calls `place_jobs` first and starts what it says; when preemption is turned on, it then
calls `choose_preemptions` with the jobs still pending (all of them, not only the `infer` ones, so
that a job ranked ahead of an `infer` job is seen) and sends SIGTERM to each chosen job, which is
requeued. The result lists the infer jobs in rank order, for each the stopped jobs by id, highest
first. Nothing starts here: once the stopped jobs have exited, `place_jobs` decides again.

Rules:

- Only pending jobs of kind `infer` that `place_jobs` would not start now get anything, taken in
  the policy's rank order. CPU-only jobs and jobs that can never start on this box get nothing.
- Only running jobs of kind `batch` are stopped; a GPU held by any other job (or by a job that
  `place_jobs` starts in this same pass) is not usable. Paused GPUs are never usable, explicit
  `gpu_ids` must all be usable, and the sharing rules are those of the policy: a job that both
  sides let share is not in the way, unless the GPU lacks memory and that job is a `batch` job.
- The fewest `batch` jobs are stopped: GPUs usable already are taken first, then GPUs whose
  holders are all `batch` jobs. Among equally few, the most recently started jobs are stopped, as
  they lose the least work; a job's start time is not known here, so the higher id counts as the
  more recent. Where there are too many ways to pick the GPUs (over 20,000), they are picked one at
  a time, cheapest next, which may stop more than the fewest.
- A job is stopped for one `infer` job at most. The GPUs an `infer` job will start on and every GPU
  of the jobs stopped for it are promised to it: a later `infer` job in the same call cannot use
  them, even to share.
- The choice is then checked with `place_jobs` itself on the board as it would be once the stopped
  jobs have exited (their GPUs counted as having nothing used, by the memory rule below): if the
  `infer` job still would not start (say it waits behind a higher-ranked job that cannot start, or
  a higher-ranked job would take the freed GPUs), nothing is stopped for it.

Memory: a running job's memory is part of `GpuState.mem_used_bytes`. Stopping jobs on a GPU
frees what their processes use there (`GpuState.mem_by_job`, which the daemon reads from NVML's
process list and /proc when a preemption is weighed), not what processes outside the queue or
other queue jobs hold. So a GPU that needs jobs stopped counts as fitting when its total memory,
less what stays used once they have exited and less what jobs started in this pass reserve
there, is at least the memory asked for: a batch job is never stopped for an `infer` job that
would still not fit. Where the shares are not known (NVML cannot say what each process uses, or
names processes of another PID namespace), stopping is taken to free everything, and the
daemon's next `place_jobs` once the stopped jobs have exited decides with the real free memory.
On a GPU where nothing is stopped, the memory asked for must be free as in `place_jobs`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpubox.queue.policy import (
    GpuState,
    JobRequest,
    PolicyConfig,
    RunningJob,
    _Board,
    _candidates,
    _gpu_count,
    _impossible,
    _rank,
    place_jobs,
)

# Above this many ways to pick GPUs, the GPUs are picked one at a time (cheapest next) instead.
_MAX_COMBINATIONS = 20_000


@dataclass(frozen=True)
class Preempt:
    job_id: int  # the running batch job to stop (SIGTERM, then requeued)
    for_job_id: int  # the waiting infer job it makes room for


def _cost(jobs: frozenset[int]) -> tuple[int, tuple[int, ...]]:
    """Fewer jobs first; among as many, the set whose newest jobs are newer (higher ids) first."""
    return (len(jobs), tuple(-i for i in sorted(jobs, reverse=True)))


def _cheapest(options: list[frozenset[int]], k: int) -> frozenset[int]:
    """The smallest union of `k` of the options (each the jobs to stop to free one GPU)."""
    if math.comb(len(options), k) <= _MAX_COMBINATIONS:
        unions = (frozenset[int]().union(*pick) for pick in itertools.combinations(options, k))
        return min(unions, key=_cost)
    chosen: frozenset[int] = frozenset()
    left = list(options)
    for _ in range(k):
        best = min(range(len(left)), key=lambda i: _cost(chosen | left[i]))
        chosen |= left.pop(best)
    return chosen


def _to_stop(
    gpu: GpuState,
    job: JobRequest,
    board: _Board,
    stoppable: dict[int, RunningJob],
    promised: set[str],
) -> frozenset[int] | None:
    """The batch jobs to stop so the job could use this GPU (empty: usable now), or None: not usable."""
    if gpu.paused or gpu.uuid in promised:
        return None
    need = job.gpu_mem_bytes
    held = board.blockers(gpu, job)
    if not held:
        if need is None or board.free(gpu) >= need:
            return frozenset()
        held = [h for h in board.holders[gpu.uuid] if h.id in stoppable]
        if not held:
            return None
    if any(h.id not in stoppable for h in held):
        return None
    stop = frozenset(h.id for h in held)
    if need is not None and gpu.mem_total_bytes - kept_memory(gpu, stop) - board.reserved[gpu.uuid] < need:
        return None  # what the stopped jobs do not hold stays held: too little room
    return stop


def kept_memory(gpu: GpuState, stopped: frozenset[int] | set[int]) -> int:
    """The memory still used on the GPU once the `stopped` jobs have exited: all it uses, less
    their share; none when the shares are not known (as if stopping freed everything)."""
    if gpu.mem_by_job is None:
        return 0
    return max(0, gpu.mem_used_bytes - sum(used for job, used in gpu.mem_by_job if job in stopped))


def _choose(
    job: JobRequest,
    board: _Board,
    stoppable: dict[int, RunningJob],
    promised: set[str],
) -> frozenset[int] | None:
    """The fewest batch jobs to stop for the job, judged on the board; None when no choice helps."""
    options = [_to_stop(g, job, board, stoppable, promised) for g in _candidates(job, board)]
    if job.gpu_ids is not None:
        if any(o is None for o in options):
            return None
        return frozenset[int]().union(*(o for o in options if o is not None))
    usable = [o for o in options if o is not None]
    free_now = sum(1 for o in usable if not o)
    short = job.gpus - free_now
    if short <= 0:
        return frozenset()
    to_free = [o for o in usable if o]
    if len(to_free) < short:
        return None
    return _cheapest(to_free, short)


def choose_preemptions(
    pending: Sequence[JobRequest],
    running: Sequence[RunningJob],
    gpus: Sequence[GpuState],
    now: float,
    config: PolicyConfig = PolicyConfig(),  # noqa: B008 (frozen, as in place_jobs)
) -> list[Preempt]:
    """The running batch jobs to stop for waiting infer jobs, in the infer jobs' rank order."""
    starts, _ = place_jobs(pending, running, gpus, now, config)
    by_id = {j.id: j for j in pending}
    board = _Board(running, gpus)
    for start in starts:
        board.take(by_id[start.job_id], start.gpu_uuids, now)
    started = {s.job_id for s in starts}
    stoppable = {r.id: r for r in running if r.kind == "batch" and r.gpu_uuids}
    promised: set[str] = set()
    stopped: dict[int, RunningJob] = {}
    chosen: list[Preempt] = []
    for job in sorted(pending, key=lambda j: _rank(j, config)):
        if job.kind != "infer" or job.id in started or _gpu_count(job) == 0 or _impossible(job, board) is not None:
            continue
        stop = _choose(job, board, stoppable, promised)
        if not stop:
            continue
        after = {**stopped, **{i: stoppable[i] for i in stop}}
        freed = {u for r in after.values() for u in r.gpu_uuids}
        gone = set(after)
        gpus_after = [
            dataclasses.replace(g, mem_used_bytes=kept_memory(g, gone)) if g.uuid in freed else g for g in gpus
        ]
        running_after = [r for r in running if r.id not in after]
        starts_after, _ = place_jobs(pending, running_after, gpus_after, now, config)
        mine = [s for s in starts_after if s.job_id == job.id]
        if not mine:
            continue
        stopped = after
        for i in stop:
            del stoppable[i]
            promised.update(stopped[i].gpu_uuids)
        promised.update(mine[0].gpu_uuids)
        chosen.extend(Preempt(i, job.id) for i in sorted(stop, reverse=True))
    return chosen
