"""What the queue stores: a job's specification, its current record, and each attempt.

A spec is what was submitted and never changes once a job has started; `Job` is the row as it
stands now; `Attempt` is one run of it, with its own exit code and log. Specs are stored as JSON.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from functools import lru_cache

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

KINDS = ("infer", "quantize", "train", "batch", "other")  # also the default order: most urgent first
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "timeout", "lost")
END_STATES = ("succeeded", "failed", "cancelled", "timeout", "lost")
MAX_PRIORITY = 1000
MAX_RETRIES = 100
# How one attempt can end; `preempted` sends the job back to the queue.
OUTCOMES = (*END_STATES, "preempted")


@dataclass(frozen=True)
class JobSpec:
    argv: tuple[str, ...]
    cwd: str = "."
    env: dict[str, str] = field(default_factory=dict)
    kind: str = "other"
    name: str | None = None
    gpus: int | None = None  # None: the box's default (1 where there are GPUs, else 0)
    gpu_ids: tuple[str, ...] | None = None  # explicit GPUs, by UUID
    gpu_mem_bytes: int | None = None
    priority: int = 0
    after: tuple[int, ...] = ()
    time_limit_s: float | None = None
    retries: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    shell: bool = False
    probe: bool = True
    share: bool = False

    @property
    def command(self) -> str:
        """The command as a person would type it."""
        if self.shell:
            return self.argv[-1]
        return " ".join(shlex.quote(a) for a in self.argv)


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: str
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0
    exit_code: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    pid: int | None = None  # the job's supervisor, which outlives the daemon
    pid_start: int | None = None  # its start time in clock ticks, so a reused pid is not taken for it
    boot_id: str | None = None
    reason: str | None = None  # why it waits, or how it ended
    request: str | None = None  # "cancel" or "preempt", asked of a running job
    failures: int = 0  # failed attempts that used up a retry
    queued_at: float | None = None  # when it was queued again after an attempt (None: never)


@dataclass(frozen=True)
class Attempt:
    job_id: int
    number: int
    started_at: float
    ended_at: float | None
    exit_code: int | None
    gpu_uuids: tuple[str, ...]
    pid: int | None
    boot_id: str
    log_path: str | None  # the prefix: `.out` and `.err` follow it
    outcome: str | None = None
    reason: str | None = None


_ENV_JSON: list[tuple[dict[str, str], str]] = []  # the environment encoded last (a copy) and its JSON


def _env_json(env: dict[str, str]) -> str:
    """The environment's JSON: the jobs of one `queue add --file` share theirs, and each launch
    the daemon writes encodes it again, so the last one is kept (compared whole, never trusted
    by identity: a dict can change)."""
    if _ENV_JSON and _ENV_JSON[0][0] == env:
        return _ENV_JSON[0][1]
    text = json.dumps(env, sort_keys=True)
    # Kept only when all is text: a text equals only a text, so no other dict equal to this one
    # (1 == True == 1.0) can encode differently.
    if all(type(k) is str and type(v) is str for k, v in env.items()):
        _ENV_JSON[:] = [(dict(env), text)]
    return text


def spec_to_json(spec: JobSpec) -> str:
    """The spec as stored: JSON with sorted keys, the same text for the same spec (the store
    compares it to tell an edited job). The environment, most of the text, is encoded once and
    set in its place between "cwd" and "gpu_ids" (no key sorts between them): outside a string a
    JSON text has no `, "gpu_ids": ` but the key's own."""
    rest = json.dumps(
        {
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "kind": spec.kind,
            "name": spec.name,
            "gpus": spec.gpus,
            "gpu_ids": None if spec.gpu_ids is None else list(spec.gpu_ids),
            "gpu_mem_bytes": spec.gpu_mem_bytes,
            "priority": spec.priority,
            "after": list(spec.after),
            "time_limit_s": spec.time_limit_s,
            "retries": spec.retries,
            "tags": spec.tags,
            "shell": spec.shell,
            "probe": spec.probe,
            "share": spec.share,
        },
        sort_keys=True,
    )
    head, _, tail = rest.partition(', "gpu_ids": ')
    return f'{head}, "env": {_env_json(spec.env)}, "gpu_ids": {tail}'


@lru_cache(maxsize=4096)
def spec_from_json(text: str) -> JobSpec:
    """The spec stored as `text`; cached, since the daemon reads the same queued jobs each pass
    (a JobSpec is never changed in place: an edit stores a new one)."""
    d: dict[str, Any] = json.loads(text)
    gpu_ids = d["gpu_ids"]
    return JobSpec(
        argv=tuple(d["argv"]),
        cwd=d["cwd"],
        env=dict(d["env"]),
        kind=d["kind"],
        name=d["name"],
        gpus=d["gpus"],
        gpu_ids=None if gpu_ids is None else tuple(gpu_ids),
        gpu_mem_bytes=d["gpu_mem_bytes"],
        priority=d["priority"],
        after=tuple(d["after"]),
        time_limit_s=d["time_limit_s"],
        retries=d["retries"],
        tags=dict(d["tags"]),
        shell=d["shell"],
        probe=d["probe"],
        share=d["share"],
    )


def has_control(text: str) -> bool:
    """Whether text holds what would break a line in a listing: a control character (C0, DEL,
    C1, where ESC and CSI start terminal sequences) or a line or paragraph separator."""
    return any(c < " " or "\x7f" <= c <= "\x9f" or c in "\u2028\u2029" for c in text)


def check_spec(spec: JobSpec, kinds: tuple[str, ...], check_text: bool = True) -> None:
    """Raise ValueError, with one clear line, for a spec the queue cannot run. `check_text`: also the
    command's, environment's and name's text (a job stored by an older gpubox, edited, keeps
    the text it was accepted with)."""
    if not spec.argv or any(not isinstance(a, str) for a in spec.argv) or not spec.argv[0].strip():
        raise ValueError("the command is empty")
    if spec.kind not in kinds:
        raise ValueError(f"unknown kind {spec.kind!r} (expected one of: {', '.join(kinds)})")
    if spec.gpus is not None and spec.gpus < 0:
        raise ValueError(f"the GPU count must be 0 or more, not {spec.gpus}")
    if spec.gpu_ids is not None and not spec.gpu_ids:
        raise ValueError("an explicit GPU list must name at least one GPU")
    if spec.gpu_ids is not None and spec.gpus not in (None, len(spec.gpu_ids)):
        raise ValueError("give either a GPU count or a GPU list, not both")
    if spec.gpu_mem_bytes is not None and spec.gpu_mem_bytes <= 0:
        raise ValueError(f"the GPU memory asked for must be positive, not {spec.gpu_mem_bytes}")
    if spec.gpu_mem_bytes is not None and spec.gpus == 0:
        raise ValueError("a CPU-only job (--gpus 0) cannot ask for GPU memory")
    if spec.time_limit_s is not None and not spec.time_limit_s > 0:
        raise ValueError(f"the time limit must be positive, not {spec.time_limit_s}")
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise ValueError(f"invalid retries {spec.retries}: expected 0 to {MAX_RETRIES}")
    if not -MAX_PRIORITY <= spec.priority <= MAX_PRIORITY:
        raise ValueError(f"invalid priority {spec.priority}: expected {-MAX_PRIORITY} to {MAX_PRIORITY}")
    if "\0" in "".join(spec.argv) or "\0" in spec.cwd:
        raise ValueError("the command contains a NUL byte")
    keys = "".join(spec.env)  # joined: one pass in C, where a test a variable cost a 1,000-line file 6 ms
    if "" in spec.env or "=" in keys or "\0" in keys or "\0" in "".join(spec.env.values()):
        raise ValueError(
            "an environment variable has an empty name, or a NUL byte or '=' in its name, or a NUL in its value"
        )
    if not check_text:
        return
    # What reaches the kernel must be bytes: text that came from bytes (surrogateescape) is, a
    # lone surrogate (from JSON's "\ud800", say) is not, and would fail only when the job starts.
    try:  # all at once: one call, where one a string cost a 1,000-line file 13 ms
        "\0".join((*spec.argv, spec.cwd, *spec.env.keys(), *spec.env.values())).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        texts = [("the command", a) for a in spec.argv] + [("the working directory", spec.cwd)]
        texts += [(f"the environment variable {k!r}", t) for k, v in spec.env.items() for t in (k, v)]
        for what, text in texts:
            try:
                text.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise ValueError(f"{what} holds {text!r}, which is not text a program can be given") from None
    if spec.name is not None:
        if not spec.name.strip() or has_control(spec.name):
            raise ValueError(f"invalid name {spec.name!r}: expected one line, with no control characters")
        try:
            spec.name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"invalid name {spec.name!r}: expected UTF-8 text") from None
