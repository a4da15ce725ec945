"""Which gpubox queue job a process belongs to, from the environment the queue started it with.

The queue sets GPUBOX_JOB_ID and GPUBOX_JOB_KIND for every job, and each process of the job
inherits them. /proc/<pid>/environ holds a process's initial environment, which never changes,
so it is read once per process (PidTable keeps the result with the pid's start time).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.queue.jobs import KINDS
from gpubox.telemetry.model import Reason

JOB_ID_VAR = "GPUBOX_JOB_ID"
JOB_KIND_VAR = "GPUBOX_JOB_KIND"
_ID_KEY = JOB_ID_VAR.encode() + b"="
_KIND_KEY = JOB_KIND_VAR.encode() + b"="
_MAX_ID_DIGITS = 18  # a job id is an SQLite rowid: it fits in 63 bits


@dataclass(frozen=True)
class JobTag:
    job_id: int | None = None
    job_kind: str | None = None
    reason: str | None = None  # a Reason value when the environment could not be read


NO_JOB = JobTag()


def parse_environ(data: bytes) -> JobTag:
    """The job named by a NUL-separated environment, or NO_JOB when it names none or names one
    badly (an id that is not a positive decimal integer, a kind the queue does not have)."""
    raw_id = raw_kind = None
    for entry in data.split(b"\0"):
        # a name set twice counts the first time, as getenv() and os.environ read it
        if raw_id is None and entry.startswith(_ID_KEY):
            raw_id = entry[len(_ID_KEY) :]
        elif raw_kind is None and entry.startswith(_KIND_KEY):
            raw_kind = entry[len(_KIND_KEY) :]
    if raw_id is None or raw_kind is None:
        return NO_JOB
    # isdigit() on bytes is ASCII only: no sign, spaces, underscores or other scripts' digits
    if not raw_id.isdigit() or len(raw_id) > _MAX_ID_DIGITS or int(raw_id) <= 0:
        return NO_JOB
    kind = raw_kind.decode("ascii", "replace")
    if kind not in KINDS:
        return NO_JOB
    return JobTag(int(raw_id), kind)


def read_job_tag(pid: int, proc_root: str = "/proc") -> JobTag:
    """The job of a process, from its initial environment. Another user's process (or one that
    is not dumpable) cannot be read: NO_JOB with reason no_permission; a pid that is gone:
    NO_JOB with reason no_process."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as fh:
            data = fh.read()
    except PermissionError:
        return JobTag(reason=Reason.NO_PERMISSION.value)
    except OSError:
        return JobTag(reason=Reason.NO_PROCESS.value)
    return parse_environ(data)
