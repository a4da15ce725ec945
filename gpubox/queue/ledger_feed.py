"""What the ledger needs from the queue: which running attempt holds which GPUs, with the job's
kind, name, tags and user, so reports need no join with the queue's database. The daemon hands
its running jobs over after each pass; the ledger's thread opens no second connection to the
queue's database (in one process, closing any descriptor of a SQLite file drops the POSIX locks
of every connection to it)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable

from gpubox.ledger.accounting import Allocation
from gpubox.queue.jobs import Job


def queue_user() -> str | None:
    """Who submits to this queue: its state directory, database and socket are its owner's alone."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return str(os.getuid())


def running_allocations(jobs: Iterable[Job] | None, user: str | None) -> list[Allocation] | None:
    """None while the daemon has not said yet which jobs run (before its first pass)."""
    if jobs is None:
        return None
    return [
        Allocation(
            job_id=job.id,
            attempt=job.attempt,
            kind=job.spec.kind,
            gpu_uuids=tuple(job.gpu_uuids),
            name=job.spec.name,
            user=user,
            tags=dict(job.spec.tags),
        )
        for job in jobs
        if job.state == "running" and job.gpu_uuids
    ]
