"""The promises place_jobs makes, checked on one box (its GPUs, running jobs and waiting jobs);
random boxes to check them on, and a shrinker that makes a failing box small enough to read."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from gpubox.queue.policy import (
    GpuState,
    JobRequest,
    PolicyConfig,
    RunningJob,
    Start,
    Wait,
    place_jobs,
)
from tests.queue.builders import GIB, gpu, job, run

CONFIG = PolicyConfig()
KINDS = CONFIG.kind_order
T = TypeVar("T")


@dataclass(frozen=True)
class Box:
    gpus: tuple[GpuState, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[JobRequest, ...]

    def code(self) -> str:
        """The box as the call that builds it, to paste into a test."""
        gpus = ", ".join(_gpu_code(g) for g in self.gpus)
        running = ", ".join(_run_code(r) for r in self.running)
        pending = ", ".join(_job_code(j) for j in self.pending)
        return f"box([{gpus}], [{running}], [{pending}])"


@dataclass(frozen=True)
class Broken:
    promise: str
    detail: str

    def __str__(self) -> str:
        return f"{self.promise}: {self.detail}"


def box(gpus: Sequence[GpuState], running: Sequence[RunningJob], pending: Sequence[JobRequest]) -> Box:
    return Box(tuple(gpus), tuple(running), tuple(pending))


def random_box(seed: int) -> Box:
    """Up to 4 GPUs (some small, used, paused), up to 3 running jobs, up to 5 waiting GPU jobs,
    and now and then CPU-only jobs."""
    r = random.Random(seed)
    gpus = []
    for i in range(r.randint(1, 4)):
        total = 80 if r.random() < 0.75 else r.choice([24, 40])
        used = 0 if r.random() < 0.7 else r.choice([5, 10, 20, 30, 50, 70])
        gpus.append(gpu(i, total, min(used, total), paused=r.random() < 0.08))
    uuids = [g.uuid for g in gpus]
    running = []
    exclusive: set[str] = set()
    shared: set[str] = set()
    for k in range(r.randint(0, 3)):
        share = r.random() < 0.35
        count = r.randint(1, min(2, len(gpus)))
        free = [u for u in uuids if u not in exclusive and (share or u not in shared)]
        if len(free) < count:
            continue
        held = sorted(r.sample(free, count))
        (shared if share else exclusive).update(held)
        ends_by = None if r.random() < 0.25 else r.randint(1, 20)
        running.append(run(100 + k, *held, ends_by=ends_by, share=share))
    pending = []
    for k in range(r.randint(1, 5)):
        ids = tuple(r.sample(uuids, r.randint(1, min(2, len(gpus))))) if r.random() < 0.3 else None
        count = 1 if ids is not None else r.choice([1, 1, 1, 2, 2, 3])  # named GPUs set the count
        mem = None if r.random() < 0.55 else r.choice([10, 20, 30, 40, 60, 79])
        limit = None if r.random() < 0.3 else r.randint(1, 30)
        kind, priority, at = r.choice(KINDS), r.choice([0, 0, 0, 1, 2]), r.randint(0, 5)
        pending.append(job(k + 1, kind, priority, at, count, ids, mem, limit, share=r.random() < 0.3))
    # A running job counts for the memory it asked for until it has allocated it.
    running = [replace(j, gpu_mem_bytes=r.choice([10, 20]) * GIB) if r.random() < 0.2 else j for j in running]
    if r.random() < 0.2:
        running.append(run(200, ends_by=r.randint(1, 20)))
    for k in range(r.choice([0, 0, 0, 1, 2])):
        pending.append(job(20 + k, r.choice(KINDS), r.choice([0, 2]), r.randint(0, 5), gpus=0, limit=10))
    return box(gpus, running, pending)


def broken_promises(box: Box, config: PolicyConfig = CONFIG) -> list[Broken]:
    """Every promise place_jobs breaks on this box at time 0."""
    starts, waits = place_jobs(box.pending, box.running, box.gpus, 0.0, config)
    broken = _decisions(box, starts, waits)
    if broken:
        return broken  # the checks below read one decision per job
    broken += _placement(box, starts)
    broken += _cpu_line(box, starts, waits, config)
    broken += _waits_name_jobs_ahead(box, starts, waits, config)
    broken += _head_of_line(box, starts, config)
    broken += _backfill(box, starts, config)
    return broken


def _decisions(box: Box, starts: list[Start], waits: list[Wait]) -> list[Broken]:
    decided = sorted([s.job_id for s in starts] + [w.job_id for w in waits])
    if decided != sorted(j.id for j in box.pending):
        return [Broken("one decision per waiting job", f"jobs {[j.id for j in box.pending]}, decided {decided}")]
    return []


def _placement(box: Box, starts: list[Start]) -> list[Broken]:
    """Each start takes the GPUs it asked for, none paused, none it may not share, within memory."""
    broken = []
    gpus = {g.uuid: g for g in box.gpus}
    jobs = {j.id: j for j in box.pending}
    holders = {u: [r for r in box.running if u in r.gpu_uuids] for u in gpus}
    taken = {u: 0 for u in gpus}
    for start in starts:
        j, uuids = jobs[start.job_id], start.gpu_uuids
        if len(set(uuids)) != len(uuids) or len(uuids) != _gpu_count(j) or not set(uuids) <= gpus.keys():
            broken.append(Broken("a start takes the GPUs it asked for", f"job {j.id} got {uuids}"))
            continue
        if j.gpu_ids is not None and set(uuids) != set(j.gpu_ids):
            broken.append(Broken("a start takes the GPUs it named", f"job {j.id} named {j.gpu_ids}, got {uuids}"))
        for u in uuids:
            g = gpus[u]
            if g.paused:
                broken.append(Broken("a paused GPU stays idle", f"job {j.id} started on GPU {g.index}"))
            for h in holders[u]:
                if not (j.share and h.share):
                    broken.append(Broken("a GPU is shared only by jobs that share", f"jobs {h.id} and {j.id}"))
            holders[u].append(RunningJob(j.id, j.kind, uuids, None, j.share))
            taken[u] += j.gpu_mem_bytes or 0
    for u, g in gpus.items():
        if taken[u] and taken[u] > _free(g, box.running):
            detail = f"GPU {g.index} has {_free(g, box.running) / GIB:g} GiB free, jobs started on it ask for "
            broken.append(Broken("a GPU's memory is not overcommitted", detail + f"{taken[u] / GIB:g} GiB"))
    return broken


def _free(gpu: GpuState, running: Sequence[RunningJob]) -> int:
    """A running job counts for what it asked for until it has allocated it."""
    declared = sum(r.gpu_mem_bytes or 0 for r in running if gpu.uuid in r.gpu_uuids)
    return gpu.mem_total_bytes - max(gpu.mem_used_bytes, declared)


def _cpu_line(box: Box, starts: list[Start], waits: list[Wait], config: PolicyConfig) -> list[Broken]:
    """CPU-only jobs have their own slots, and no say in what happens on the GPUs."""
    broken = []
    cpu_jobs = {j.id for j in box.pending if _gpu_count(j) == 0}
    in_use = sum(1 for r in box.running if not r.gpu_uuids) + sum(1 for s in starts if s.job_id in cpu_jobs)
    if cpu_jobs and in_use > config.max_cpu_jobs:
        broken.append(Broken("CPU-only jobs fill at most their slots", f"{in_use} for {config.max_cpu_jobs}"))
    gpu_only = _gpu_part(box)
    if gpu_only != box:
        alone = place_jobs(gpu_only.pending, gpu_only.running, gpu_only.gpus, 0.0, config)
        together = ([s for s in starts if s.job_id not in cpu_jobs], [w for w in waits if w.job_id not in cpu_jobs])
        if together != alone:
            detail = f"with them {together}, without {alone}"
            broken.append(Broken("CPU-only jobs change nothing on the GPUs", detail))
    return broken


def _waits_name_jobs_ahead(box: Box, starts: list[Start], waits: list[Wait], config: PolicyConfig) -> list[Broken]:
    broken = []
    jobs = {j.id: j for j in box.pending}
    started = {s.job_id for s in starts}
    for w in waits:
        if not w.reason.startswith("waits behind job "):
            continue
        ahead = jobs.get(int(w.reason.removeprefix("waits behind job ").split()[0]))
        if ahead is None or ahead.id in started or not _rank(ahead, config) < _rank(jobs[w.job_id], config):
            broken.append(Broken("a job waits only behind a waiting job ahead of it", f"job {w.job_id}: {w.reason}"))
    return broken


def _head_of_line(box: Box, starts: list[Start], config: PolicyConfig) -> list[Broken]:
    """The first waiting GPU job that could ever start here does not wait while GPUs it fits on are
    free (jobs ahead of it that never can do not hold the queue)."""
    started = {s.job_id for s in starts}
    jobs = {j.id: j for j in box.pending}
    holders = list(box.running)
    holders += [RunningJob(s.job_id, "", s.gpu_uuids, None, jobs[s.job_id].share) for s in starts]
    reserved = {
        g.uuid: sum(jobs[s.job_id].gpu_mem_bytes or 0 for s in starts if g.uuid in s.gpu_uuids) for g in box.gpus
    }
    for j in sorted(box.pending, key=lambda j: _rank(j, config)):
        if _gpu_count(j) == 0 or j.id in started:
            continue
        usable = [
            g
            for g in box.gpus
            if not g.paused
            and not any(g.uuid in h.gpu_uuids and not (j.share and h.share) for h in holders)
            and (j.gpu_mem_bytes or 0) <= _free(g, box.running) - reserved[g.uuid]
        ]
        if _fits(j, usable):
            return [Broken("the first job that could ever start does not wait on free GPUs", f"job {j.id}")]
        if _fits(j, box.gpus, ever=True):
            break
    return []


def _fits(job: JobRequest, gpus: Sequence[GpuState], ever: bool = False) -> bool:
    """Whether the job fits on these GPUs (ever: on an idle box, with all their memory free)."""
    if ever:
        gpus = [g for g in gpus if (job.gpu_mem_bytes or 0) <= g.mem_total_bytes]
    uuids = {g.uuid for g in gpus}
    if job.gpu_ids is not None:
        return set(job.gpu_ids) <= uuids
    return len(uuids) >= job.gpus


def _backfill(box: Box, starts: list[Start], config: PolicyConfig) -> list[Broken]:
    """A job that starts ahead of waiting jobs ranked above it delays none of them: with jobs
    holding their GPUs for their time limits, each of those starts no later than without it."""
    gpu_box = _gpu_part(box)
    started = {s.job_id: s.gpu_uuids for s in starts if s.gpu_uuids}
    waiting = [j for j in gpu_box.pending if j.id not in started]
    passers = [j for j in gpu_box.pending if j.id in started]  # started, perhaps ahead of waiting jobs
    if not any(_rank(w, config) < _rank(p, config) for p in passers for w in waiting):
        return []
    with_all = _start_times(gpu_box, started, waiting, config)
    broken = []
    for p in passers:
        ahead = [w for w in waiting if _rank(w, config) < _rank(p, config)]
        if not ahead:
            continue
        without = _start_times(gpu_box, {i: u for i, u in started.items() if i != p.id}, waiting, config)
        for w in ahead:
            if with_all[w.id] > without[w.id]:
                late = f"job {w.id} starts at {with_all[w.id]:g}, not {without[w.id]:g}"
                detail = f"job {p.id} starts ahead of job {w.id}: {late}"
                broken.append(Broken("a backfilled job delays no job ahead of it", detail))
    return broken


def _start_times(
    box: Box, started: dict[int, tuple[str, ...]], waiting: list[JobRequest], config: PolicyConfig
) -> dict[int, float]:
    """When each waiting job starts (inf: never) once the jobs in `started` start at 0, in a box
    where every job holds its GPUs for exactly its time limit (for ever without one) and allocates
    the memory it asked for; place_jobs decides again each time a job ends."""
    jobs = {j.id: j for j in box.pending}
    # (job, its GPUs, when it started)
    on_gpus = [(jobs[i], uuids, 0.0) for i, uuids in started.items()]
    when = {j.id: math.inf for j in waiting}
    pending = list(waiting)
    now = 0.0
    while pending:
        ends = [r.ends_by for r in box.running if r.ends_by is not None and r.ends_by > now]
        ends += [t + j.time_limit_s for j, _, t in on_gpus if j.time_limit_s is not None and t + j.time_limit_s > now]
        if not ends:
            break
        now = min(ends)
        running = [r for r in box.running if r.ends_by is None or r.ends_by > now]
        allocated = {g.uuid: 0 for g in box.gpus}
        for j, uuids, t in on_gpus:
            ends_by = t + j.time_limit_s if j.time_limit_s is not None else None
            if ends_by is None or ends_by > now:
                running.append(RunningJob(j.id, j.kind, uuids, ends_by, j.share, j.gpu_mem_bytes))
                for u in uuids:
                    allocated[u] += j.gpu_mem_bytes or 0
        gpus = [replace(g, mem_used_bytes=g.mem_used_bytes + allocated[g.uuid]) for g in box.gpus]
        starts, _ = place_jobs(pending, running, gpus, now, config)
        for s in starts:
            when[s.job_id] = now
            on_gpus.append((jobs[s.job_id], s.gpu_uuids, now))
        pending = [j for j in pending if when[j.id] == math.inf]
    return when


def _rank(job: JobRequest, config: PolicyConfig) -> tuple[int, int, float, int]:
    """Higher priority first, then kind in the configured order, then submission, then id."""
    order = config.kind_order
    return (-job.priority, order.index(job.kind) if job.kind in order else len(order), job.submitted_at, job.id)


def _gpu_count(job: JobRequest) -> int:
    return len(job.gpu_ids) if job.gpu_ids is not None else job.gpus


def _gpu_part(box: Box) -> Box:
    return Box(
        box.gpus, tuple(r for r in box.running if r.gpu_uuids), tuple(j for j in box.pending if _gpu_count(j) > 0)
    )


def shrink(box: Box, promise: str, config: PolicyConfig = CONFIG) -> Box:
    """The smallest box found by single steps (a job, a GPU or a detail less) that still breaks the
    promise, numbered from GPU 0 and job 1 where that keeps it broken."""

    def breaks(candidate: Box) -> bool:
        return any(b.promise == promise for b in broken_promises(candidate, config))

    smaller = True
    while smaller:
        smaller = False
        for candidate in _simpler(box):
            if breaks(candidate):
                box, smaller = candidate, True
                break
    renumbered = _renumbered(box)
    return renumbered if breaks(renumbered) else box


def _simpler(box: Box) -> Iterator[Box]:
    for i in range(len(box.pending)):
        yield replace(box, pending=_without(box.pending, i))
    for i in range(len(box.running)):
        yield replace(box, running=_without(box.running, i))
    named = {u for r in box.running for u in r.gpu_uuids} | {u for j in box.pending for u in j.gpu_ids or ()}
    for i, g in enumerate(box.gpus):
        if g.uuid not in named:
            yield replace(box, gpus=_without(box.gpus, i))
        for plain_gpu in [replace(g, paused=False), replace(g, mem_used_bytes=0), replace(g, mem_total_bytes=80 * GIB)]:
            if plain_gpu != g:
                yield replace(box, gpus=_swap(box.gpus, i, plain_gpu))
    for i, r in enumerate(box.running):
        for plain_run in [
            replace(r, share=False),
            replace(r, ends_by=None),
            replace(r, gpu_mem_bytes=None),
            *(replace(r, gpu_uuids=uuids) for uuids in _one_less(r.gpu_uuids)),
        ]:
            if plain_run != r:
                yield replace(box, running=_swap(box.running, i, plain_run))
    for i, j in enumerate(box.pending):
        for plain_job in [
            replace(j, share=False),
            replace(j, gpu_mem_bytes=None),
            replace(j, kind="train"),
            replace(j, priority=0),
            replace(j, submitted_at=0.0),
            replace(j, gpus=max(j.gpus - 1, 1)),
            replace(j, time_limit_s=None),
            *(replace(j, gpu_ids=uuids) for uuids in _one_less(j.gpu_ids or ())),
        ]:
            if plain_job != j:
                yield replace(box, pending=_swap(box.pending, i, plain_job))


def _one_less(uuids: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each way to drop one of two or more GPUs."""
    return [_without(uuids, i) for i in range(len(uuids))] if len(uuids) > 1 else []


def _renumbered(box: Box) -> Box:
    """GPUs 0, 1, ... and waiting jobs 1, 2, ... in the same order, which ranks and places them alike."""
    ordered = sorted(box.gpus, key=lambda g: g.index)
    gpus = {g.uuid: replace(g, uuid=f"GPU-{i}", index=i) for i, g in enumerate(ordered)}
    jobs = {j.id: i for i, j in enumerate(sorted(box.pending, key=lambda j: j.id), start=1)}

    def uuids(named: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(gpus[u].uuid if u in gpus else u for u in named)

    return Box(
        tuple(gpus.values()),
        tuple(replace(r, gpu_uuids=uuids(r.gpu_uuids)) for r in box.running),
        tuple(replace(j, id=jobs[j.id], gpu_ids=None if j.gpu_ids is None else uuids(j.gpu_ids)) for j in box.pending),
    )


def _without(items: tuple[T, ...], i: int) -> tuple[T, ...]:
    return items[:i] + items[i + 1 :]


def _swap(items: tuple[T, ...], i: int, item: T) -> tuple[T, ...]:
    return (*items[:i], item, *items[i + 1 :])


def _gpu_code(g: GpuState) -> str:
    args = [str(g.index)]
    if g.mem_total_bytes != 80 * GIB:
        args.append(f"total_gib={g.mem_total_bytes / GIB:g}")
    if g.mem_used_bytes:
        args.append(f"used_gib={g.mem_used_bytes / GIB:g}")
    if g.paused:
        args.append("paused=True")
    return f"gpu({', '.join(args)})"


def _run_code(r: RunningJob) -> str:
    args = [str(r.id), _quoted(r.gpu_uuids)] if r.gpu_uuids else [str(r.id)]
    if r.kind != "train":
        args.append(f'kind="{r.kind}"')
    if r.ends_by is not None:
        args.append(f"ends_by={r.ends_by:g}")
    if r.share:
        args.append("share=True")
    if r.gpu_mem_bytes is not None:
        args.append(f"mem_gib={r.gpu_mem_bytes // GIB}")
    return f"run({', '.join(args)})"


def _job_code(j: JobRequest) -> str:
    args = [str(j.id)]
    if j.kind != "train":
        args.append(f'"{j.kind}"')
    if j.priority:
        args.append(f"priority={j.priority}")
    if j.submitted_at:
        args.append(f"at={j.submitted_at:g}")
    if j.gpu_ids is not None:
        one = "," if len(j.gpu_ids) == 1 else ""
        args.append(f"ids=({_quoted(j.gpu_ids)}{one})")
    elif j.gpus != 1:
        args.append(f"gpus={j.gpus}")
    if j.gpu_mem_bytes is not None:
        args.append(f"mem_gib={j.gpu_mem_bytes // GIB}")
    if j.time_limit_s is not None:
        args.append(f"limit={j.time_limit_s:g}")
    if j.share:
        args.append("share=True")
    return f"job({', '.join(args)})"


def _quoted(uuids: tuple[str, ...]) -> str:
    return ", ".join(f'"{u}"' for u in uuids)
