"""One scheduling pass, without side effects: from the store's jobs and the GPUs to a plan.

It resolves dependencies (a job whose dependency did not succeed fails with the reason; one
whose dependencies are still going waits), applies the box's default GPU count, honours a
paused queue and paused GPUs, and asks the placement policy (and, when turned on, the
preemption rule) what to do. The daemon carries the plan out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpubox.queue.gpus import GpuInfo
from gpubox.queue.jobs import KINDS, Job
from gpubox.queue.policy import GpuState, JobRequest, PolicyConfig, RunningJob, Start, _gpu_count, _rank, place_jobs
from gpubox.queue.preempt import Preempt, choose_preemptions
from gpubox.queue.store import QUEUE

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class QueueConfig:
    default_gpus: int = 1
    max_cpu_jobs: int = 1
    kind_order: tuple[str, ...] = KINDS
    backfill: bool = True
    preempt: bool = False
    kill_grace_s: float = 10.0
    poll_interval_s: float = 2.0

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> QueueConfig:
        """From a loaded gpubox config (keys `queue.*`)."""
        return cls(
            default_gpus=int(values["queue.default_gpus"]),
            max_cpu_jobs=int(values["queue.max_cpu_jobs"]),
            kind_order=tuple(values["queue.kind_order"]),
            backfill=bool(values["queue.backfill"]),
            preempt=bool(values["queue.preempt"]),
            kill_grace_s=float(values["queue.kill_grace"]),
            poll_interval_s=float(values["queue.poll_interval"]),
        )

    @property
    def policy(self) -> PolicyConfig:
        return PolicyConfig(kind_order=self.kind_order, max_cpu_jobs=self.max_cpu_jobs, backfill=self.backfill)


@dataclass(frozen=True)
class Plan:
    starts: list[Start] = field(default_factory=list)
    waits: dict[int, str] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)  # queued jobs whose dependency failed
    preempts: list[Preempt] = field(default_factory=list)


PAUSED = "the queue is paused (gpubox queue resume)"


def gpu_count_of(job: Job, box_gpus: int, config: QueueConfig) -> int:
    """The GPUs a job asks for: its own count, its explicit list, or the box's default."""
    spec = job.spec
    if spec.gpu_ids is not None:
        return len(spec.gpu_ids)
    if spec.gpus is not None:
        return spec.gpus
    return config.default_gpus if box_gpus > 0 else 0


def _dependencies(job: Job, states: Mapping[int, str | None]) -> tuple[str | None, str | None]:
    """(why it fails, why it waits); both None when every dependency succeeded."""
    waiting: list[str] = []
    for dep in job.spec.after:
        state = states.get(dep)
        if state is None:
            return f"job {dep}, which it runs after, no longer exists", None
        if state in ("failed", "cancelled", "timeout", "lost"):
            return f"job {dep}, which it runs after, ended {state}", None
        if state != "succeeded":
            waiting.append(f"job {dep} ({state})")
    if waiting:
        return None, "waits for " + " and ".join(waiting) + " to succeed"
    return None, None


def plan_pass(
    queued: Sequence[Job],
    running: Sequence[Job],
    dep_states: Mapping[int, str | None],
    gpus: Sequence[GpuInfo] | None,
    paused: Mapping[str, float],
    now: float,
    config: QueueConfig = QueueConfig(),
    gpus_unknown: str = "the GPUs cannot be read",
    job_memory: Callable[[], Mapping[str, tuple[tuple[int, int], ...] | None]] | None = None,
) -> Plan:
    """`gpus` None: the box has GPUs but they cannot be read now (NVML failed); then only jobs
    that asked for no GPU (--gpus 0) may start, and the others wait with `gpus_unknown`.
    `job_memory`: per GPU UUID, what each running job's processes use there, read only when a
    preemption is weighed (NVML's process lists and /proc are dear on a busy box)."""
    plan = Plan()
    eligible: list[Job] = []
    for job in queued:
        failure, wait = _dependencies(job, dep_states)
        if failure is not None:
            plan.failures[job.id] = failure
        elif wait is not None:
            plan.waits[job.id] = wait
        else:
            eligible.append(job)
    if QUEUE in paused:
        plan.waits.update(dict.fromkeys((j.id for j in eligible), PAUSED))
        return plan
    if gpus is None:
        blind = [j for j in eligible if j.spec.gpus != 0]
        plan.waits.update(dict.fromkeys((j.id for j in blind), f"waits for the GPUs to be readable: {gpus_unknown}"))
        eligible = [j for j in eligible if j.spec.gpus == 0]
        gpus = []
    requests = [
        JobRequest(
            id=j.id,
            kind=j.spec.kind,
            priority=j.spec.priority,
            submitted_at=j.submitted_at,
            gpus=gpu_count_of(j, len(gpus), config),
            gpu_ids=j.spec.gpu_ids,
            gpu_mem_bytes=j.spec.gpu_mem_bytes,
            time_limit_s=j.spec.time_limit_s,
            share=j.spec.share,
        )
        for j in eligible
    ]
    held = [
        RunningJob(
            id=j.id,
            kind=j.spec.kind,
            gpu_uuids=j.gpu_uuids,
            ends_by=(j.started_at or now) + j.spec.time_limit_s if j.spec.time_limit_s is not None else None,
            share=j.spec.share,
            gpu_mem_bytes=j.spec.gpu_mem_bytes,
        )
        for j in running
    ]
    states = [GpuState(g.uuid, g.index, g.mem_total_bytes, g.mem_used_bytes, paused=g.uuid in paused) for g in gpus]
    starts, waits = place_jobs(requests, held, states, now, config.policy)
    plan.starts.extend(starts)
    plan.waits.update({w.job_id: w.reason for w in waits})
    # Only infer jobs that need a GPU are ever preempted for (a CPU-only one waits for its slot).
    if config.preempt and any(r.kind == "infer" and _gpu_count(r) > 0 for r in requests if r.id in plan.waits):
        # Jobs asked to stop already are on their way out; they are not chosen twice.
        stoppable = [h for h, j in zip(held, running, strict=True) if j.request is None]
        if job_memory is not None and any(h.kind == "batch" and h.gpu_uuids for h in stoppable):
            shares = job_memory()
            states = [dataclasses.replace(g, mem_by_job=shares.get(g.uuid)) for g in states]
        # All pending jobs go in: the rule re-runs placement, so jobs starting now keep their GPUs.
        chosen = choose_preemptions(requests, stoppable, states, now, config.policy)
        # A batch job that ranks ahead of the infer job (a higher priority) would take its GPUs
        # back as soon as it is queued again: stopping it would only repeat.
        ranks = {r.id: _rank(r, config.policy) for r in requests}
        by_id = {j.id: j for j in running}
        plan.preempts.extend(
            p for p in chosen if ranks[p.for_job_id] < _rank(_as_request(by_id[p.job_id]), config.policy)
        )
    return plan


def _as_request(job: Job) -> JobRequest:
    """A running job as it would wait in the queue again."""
    return JobRequest(
        id=job.id,
        kind=job.spec.kind,
        priority=job.spec.priority,
        submitted_at=job.submitted_at,
        gpus=len(job.gpu_uuids),
    )
