"""Jobs as plain records for `--json`, and the live facts a listing adds to them."""

from __future__ import annotations

from collections.abc import Mapping

from gpubox.queue import proctree
from gpubox.queue.jobs import Attempt, Job

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

DAEMON_DOWN = "the daemon is not running (gpubox daemon start)"


def gpu_request(job: Job, gpu_index: Mapping[str, int]) -> str:
    """What a job asked for, as a short text: a count ("1", "2"), GPUs by name ("#0,3": GPUs 0
    and 3, never to be read as a count), "cpu", "auto"; with the memory per GPU ("2×40G")."""
    spec = job.spec
    if spec.gpu_ids is not None:
        text = "#" + ",".join(str(gpu_index.get(u, u[:12])) for u in spec.gpu_ids)
    elif spec.gpus == 0:
        text = "cpu"
    elif spec.gpus is None:
        text = "auto"  # the box's default: 1 where there are GPUs, else CPU-only
    else:
        text = str(spec.gpus)
    if spec.gpu_mem_bytes is not None:
        text += f"×{spec.gpu_mem_bytes / (1 << 30):g}G"
    return text


def held_gpus(job: Job, gpu_index: Mapping[str, int]) -> list[int | str]:
    """The GPUs a running job holds, by index where known, else by UUID."""
    return [gpu_index.get(u, u) for u in job.gpu_uuids]


def waiting_reason(job: Job, live: Mapping[int, str] | None) -> str | None:
    """Why a queued job waits: the daemon's live reason, else what the store last said. `live`:
    None when no daemon answered (it is not running); empty when it was not asked."""
    if job.state != "queued":
        return job.reason
    if live is None:
        return DAEMON_DOWN
    return live.get(job.id) or job.reason or "waits for the next scheduling pass"


def job_pid(job: Job) -> int | None:
    """The pid of a running job's own process (what py-spy or nvidia-smi would name), read from
    /proc; `pid` is its supervisor's. None when the job does not run here now."""
    if job.state != "running" or job.pid is None or not proctree.is_alive(job.pid, job.pid_start):
        return None
    return proctree.job_leader(job.pid)


def job_record(
    job: Job,
    live: Mapping[int, str] | None = None,
    gpu_index: Mapping[str, int] | None = None,
    with_env: bool = False,
) -> dict[str, Any]:
    index = gpu_index or {}
    spec = job.spec
    record: dict[str, Any] = {
        "id": job.id,
        "name": spec.name,
        "kind": spec.kind,
        "state": job.state,
        "command": spec.command,
        "argv": list(spec.argv),
        "shell": spec.shell,
        "cwd": spec.cwd,
        "priority": spec.priority,
        "gpus_requested": spec.gpus,
        "gpu_ids_requested": None if spec.gpu_ids is None else list(spec.gpu_ids),
        "gpu_mem_bytes": spec.gpu_mem_bytes,
        "share": spec.share,
        "gpus": held_gpus(job, index),
        "gpu_uuids": list(job.gpu_uuids),
        "after": list(spec.after),
        "time_limit_s": spec.time_limit_s,
        "retries": spec.retries,
        "failures": job.failures,
        "probe": spec.probe,
        "tags": dict(spec.tags),
        "submitted_at": job.submitted_at,
        "queued_at": job.submitted_at if job.queued_at is None else job.queued_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "attempt": job.attempt,
        "exit_code": job.exit_code,
        "pid": job.pid,
        "job_pid": job_pid(job),
        "reason": waiting_reason(job, live),
    }
    if with_env:
        record["env"] = dict(spec.env)
    return record


def attempt_record(attempt: Attempt, gpu_index: Mapping[str, int] | None = None) -> dict[str, Any]:
    index = gpu_index or {}
    return {
        "number": attempt.number,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "exit_code": attempt.exit_code,
        "outcome": attempt.outcome,
        "reason": attempt.reason,
        "gpus": [index.get(u, u) for u in attempt.gpu_uuids],
        "gpu_uuids": list(attempt.gpu_uuids),
        "pid": attempt.pid,
        "log_prefix": attempt.log_path,
        "stdout": f"{attempt.log_path}.out" if attempt.log_path else None,
        "stderr": f"{attempt.log_path}.err" if attempt.log_path else None,
    }
