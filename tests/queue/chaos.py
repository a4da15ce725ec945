"""A seeded chaos run of the real queue, shared by tests/queue/test_queue_chaos.py and the longer
sweep in scripts/queue_chaos.py.

A stream of CPU-only jobs of mixed shapes goes in through the CLI while a second thread SIGKILLs
the daemon (sometimes with its spawner, sometimes the spawner alone, sometimes a SIGTERM instead)
at random moments, some of them timed to a job starting or ending, and sometimes starts it again
itself; otherwise the next client command does. One long job is cancelled while it runs. At the
end every job must have ended, and what each job's own shell wrote (one line when an attempt
starts, one with its exit code just before it exits) must match what `queue ls --all --json`,
`queue show --json` and the attempts table say: each attempt ran once, each recorded exit code
is the one the job exited with, retries were counted, dependants of jobs that did not succeed
failed without running and say why. Nothing may be left running.

The seed decides the jobs, the pauses between them and when the daemon is killed; the moments
the kills land in are left to the machine's timing, which is the point.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.queue.conftest import QueueBox, wait_until

END_STATES = ("succeeded", "failed", "cancelled", "timeout", "lost")
HANG = 60.0  # only a guard against a hang
STOPPED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGKILL)  # a shell stopped by its supervisor


@dataclass
class Planned:
    """One job of the stream, and what its shell does."""

    shape: str  # short, sleep, flaky, flaky_fail, after, timeout, cancel
    code: int  # what its last attempt exits with, when it runs to its end
    sleep: float = 0.0
    after: int | None = None  # index into the stream of the job it runs after
    options: tuple[str, ...] = ()
    id: int = 0


@dataclass
class Run:
    """What a chaos run did, for its checks and its report."""

    seed: int
    jobs: list[Planned] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)
    restarts: int = 0
    cancelled: int | None = None


def plan_stream(rng: random.Random, count: int) -> list[Planned]:
    jobs: list[Planned] = []
    cancel = rng.randrange(count // 4, count // 2)
    timeout = rng.choice([n for n in range(count // 3, count) if n != cancel])
    special = {cancel: "cancel", timeout: "timeout"}
    for n in range(count):
        shape = (
            special.get(n)
            or rng.choices(("short", "sleep", "flaky", "flaky_fail", "after"), weights=(40, 15, 10, 5, 20))[0]
        )
        if shape == "after" and not jobs:
            shape = "short"
        code = rng.choice((0, 0, 0, 1, 2, 3, 7, 42))
        if shape == "short":
            jobs.append(Planned(shape, code))
        elif shape == "sleep":
            jobs.append(Planned(shape, code, sleep=round(rng.uniform(0.2, 0.8), 2)))
        elif shape == "flaky":  # fails its first attempt, succeeds its retry
            jobs.append(Planned(shape, 0, options=("--retries", "1")))
        elif shape == "flaky_fail":  # fails both attempts
            jobs.append(Planned(shape, rng.choice((4, 9)), options=("--retries", "1")))
        elif shape == "after":
            jobs.append(Planned(shape, code, after=rng.randrange(len(jobs))))
        elif shape == "timeout":
            jobs.append(Planned(shape, 0, sleep=30, options=("--time-limit", "1s")))
        else:
            jobs.append(Planned(shape, 0, sleep=30))
    return jobs


def script(job: Planned, ran: Path, marks: Path) -> str:
    """The job's shell: a start line, its work, an end line with the code it then exits with."""
    me = '"$GPUBOX_JOB_ID $GPUBOX_JOB_ATTEMPT'
    if job.shape == "flaky":
        body = f"if [ -e {marks}/$GPUBOX_JOB_ID ]; then k=0; else touch {marks}/$GPUBOX_JOB_ID; k=5; fi"
    elif job.sleep:
        body = f"sleep {job.sleep}; k={job.code}"
    else:
        body = f"k={job.code}"
    return f'echo {me} start" >> {ran}; {body}; echo {me} end $k" >> {ran}; exit $k'


def _procs(box: QueueBox, what: str) -> list[int]:
    """This queue's daemons ("daemon", one still starting too) or their spawners ("spawner"):
    the supervisors the spawner forks share its command line, but not its parent."""
    marker = f"GPUBOX_STATE_DIR={box.state_dir}".encode()
    daemons = set(_procs(box, "daemon")) if what == "spawner" else set()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with suppress(OSError):
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            if what == "daemon":
                hit = argv[-3:-1] == [b"gpubox", b"daemon"]
            else:
                stat = Path(f"/proc/{name}/stat").read_text()
                parent = int(stat[stat.rfind(")") + 2 :].split()[1])
                hit = parent in daemons and any(b"gpubox.queue.zygote" in a for a in argv)
            if hit and marker in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                found.append(int(name))
    return found


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _chaos(
    box: QueueBox,
    rng: random.Random,
    stop: threading.Event,
    run: Run,
    gap: tuple[float, float],
    snipe: float,
    stopping: bool,
) -> None:
    """SIGKILL the daemon, its spawner or both at random moments until `stop` (with `stopping`,
    sometimes SIGTERM the daemon instead, as `daemon stop` does); with `snipe`, also that share of
    the moments a job starts or is about to exit (its line in ran.txt), when the daemon is
    busiest recording a start or an end."""
    ran = run_file(box)
    last = time.monotonic()
    next_at = last + rng.uniform(*gap)
    size = 0
    while not stop.wait(0.005):
        now_size = size
        with suppress(OSError):
            now_size = ran.stat().st_size
        grown, size = now_size != size, now_size
        sniped = grown and rng.random() < snipe and time.monotonic() - last >= gap[0]
        if not sniped and time.monotonic() < next_at:
            continue
        if sniped:
            time.sleep(rng.uniform(0, 0.03))
        roll = rng.random()
        daemons, spawners = _procs(box, "daemon"), _procs(box, "spawner")
        sig = signal.SIGKILL
        if roll < 0.2:
            what, pids = "spawner", spawners
        elif roll < 0.4:
            what, pids = "daemon+spawner", daemons + spawners
        elif roll < 0.5 and stopping:
            what, pids, sig = "daemon (SIGTERM)", daemons, signal.SIGTERM  # a stop: it sends its spares away
        else:
            what, pids = "daemon", daemons
        _kill(pids, sig)
        run.kills.append(f"{'sniped ' if sniped else ''}{what}:{len(pids)}")
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.3))
            box("daemon", "start")  # as systemd would; otherwise the next client command starts one
            run.restarts += 1
        last = time.monotonic()
        next_at = last + rng.uniform(*gap)


def run_file(box: QueueBox) -> Path:
    """Where each job's shell writes its lines."""
    return box.home / "work" / "ran.txt"


def chaos_run(
    box: QueueBox,
    seed: int,
    count: int = 24,
    gap: tuple[float, float] = (0.15, 0.8),
    snipe: float = 0.0,
    stopping: bool = True,
    cpu_jobs: int = 2,
    add_pause: tuple[float, float] = (0.0, 0.15),
    say: Callable[[str], None] = lambda line: None,
) -> Run:
    """The stream, the kills, the cancel; returns once every job has ended (or fails on a hang)."""
    box.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = str(cpu_jobs)
    rng = random.Random(seed)
    run = Run(seed, plan_stream(rng, count))
    ran = run_file(box)
    marks = ran.parent / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    killer = threading.Thread(
        target=_chaos,
        args=(box, random.Random(seed * 7919 + 1), stop, run, gap, snipe, stopping),
    )
    killer.start()
    try:
        for job in run.jobs:
            options = [*job.options]
            if job.after is not None:
                options += ["--after", str(run.jobs[job.after].id)]
            job.id = box.add("--gpus", "0", *options, "--shell", "--", script(job, ran, marks))
            time.sleep(rng.uniform(*add_pause))
        (cancel,) = [j for j in run.jobs if j.shape == "cancel"]
        started = f"{cancel.id} 1 start"
        wait_until(lambda: ran.exists() and started in ran.read_text().splitlines(), HANG, "the job to cancel to start")
        result = box("queue", "cancel", str(cancel.id))
        assert result.returncode == 0, result.stderr
        run.cancelled = cancel.id
        time.sleep(rng.uniform(0.3, 1.0))  # a kill or two while the stream drains
    finally:
        stop.set()
        killer.join()
    say(f"seed {seed}: kills {run.kills}, explicit restarts {run.restarts}")
    ids = [str(j.id) for j in run.jobs]
    # Starts a daemon when none runs. It exits with a failed job's own code, so what tells that
    # it waited for every job is its output: one line a job, and nothing on stderr.
    waited = box("queue", "wait", "--timeout", f"{HANG:.0f}s", *ids, timeout=HANG * 2)
    assert not waited.stderr and len(waited.stdout.splitlines()) == len(ids), (waited.returncode, waited.stderr)
    return run


def _lines(ran: Path) -> tuple[Counter[tuple[int, int]], dict[tuple[int, int], list[int]]]:
    starts: Counter[tuple[int, int]] = Counter()
    ends: dict[tuple[int, int], list[int]] = defaultdict(list)
    for line in ran.read_text().splitlines() if ran.exists() else []:
        job, attempt, what, *code = line.split()
        key = (int(job), int(attempt))
        if what == "start":
            starts[key] += 1
        else:
            ends[key].append(int(code[0]))
    return starts, ends


def _json(box: QueueBox, *args: str) -> Any:
    result = box(*args, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] is True, doc
    return doc["data"]


def check_run(box: QueueBox, run: Run, show_all: bool = True) -> None:
    """Every promise, from the jobs' side effects and the queue's own JSON; fails with what broke."""
    where = f"seed {run.seed}"
    starts, ends = _lines(run_file(box))
    listed = {j["id"]: j for j in _json(box, "queue", "ls", "--all")["jobs"]}
    assert set(listed) == {j.id for j in run.jobs}, where
    stuck = {i: j["state"] for i, j in listed.items() if j["state"] not in END_STATES}
    assert not stuck, f"{where}: jobs not ended: {stuck}"
    lost = {i: j["reason"] for i, j in listed.items() if j["state"] == "lost"}
    assert not lost, f"{where}: jobs lost: {lost}"

    # Each attempt started at most once, and only attempts the queue recorded started at all.
    twice = {k: n for k, n in starts.items() if n > 1}
    assert not twice, f"{where}: attempts started more than once: {twice}"
    recorded = box.rows("SELECT job_id, number, exit_code, outcome, reason FROM attempts ORDER BY job_id, number")
    attempts: dict[int, list[tuple[int, int | None, str | None, str | None]]] = defaultdict(list)
    for job_id, number, code, outcome, reason in recorded:
        attempts[job_id].append((number, code, outcome, reason))
    unrecorded = set(starts) - {(job_id, a[0]) for job_id, rows in attempts.items() for a in rows}
    assert not unrecorded, f"{where}: attempts ran that the queue has no record of: {sorted(unrecorded)}"

    for job in run.jobs:
        got = listed[job.id]
        rows = attempts.get(job.id, [])
        what = f"{where}: job {job.id} ({job.shape}) {got['state']} {got['reason']!r}, attempts {rows}"
        numbers = [a[0] for a in rows]
        assert numbers == list(range(1, len(rows) + 1)), what
        assert got["attempt"] == len(rows), what
        for number, code, outcome, _ in rows:
            key = (job.id, number)
            assert starts[key] == 1, f"{what}: attempt {number} was recorded but never started"
            if outcome in ("succeeded", "failed"):
                assert ends[key] == [code], f"{what}: attempt {number} exited {ends[key]}, recorded {code}"
            else:
                assert outcome in ("timeout", "cancelled"), f"{what}: attempt {number} ended {outcome}"
                assert not ends[key] and code in STOPPED_CODES, what
        if rows:
            assert got["exit_code"] == rows[-1][1], what

        dep = listed[run.jobs[job.after].id] if job.after is not None else None
        if dep is not None and dep["state"] != "succeeded":
            assert (got["state"], rows, got["attempt"]) == ("failed", [], 0), what
            assert got["reason"] and f"job {dep['id']}" in got["reason"], what
            continue
        expected = {
            "short": ("succeeded" if job.code == 0 else "failed", [job.code], 0),
            "sleep": ("succeeded" if job.code == 0 else "failed", [job.code], 0),
            "after": ("succeeded" if job.code == 0 else "failed", [job.code], 0),
            "flaky": ("succeeded", [5, 0], 1),
            "flaky_fail": ("failed", [job.code, job.code], 1),
        }.get(job.shape)
        if expected is not None:
            state, codes, failures = expected
            assert (got["state"], [a[1] for a in rows], got["failures"]) == (state, codes, failures), what
        elif job.shape == "timeout":
            assert (got["state"], len(rows), got["failures"]) == ("timeout", 1, 0), what
            assert "time limit" in got["reason"], what
        else:
            assert (got["state"], len(rows)) == ("cancelled", 1), what

    # `queue show --json` says the same of each job and its attempts as the list and the table.
    for job in run.jobs if show_all else [j for j in run.jobs if j.shape != "short"]:
        shown = _json(box, "queue", "show", str(job.id))
        assert shown["job"]["state"] == listed[job.id]["state"], where
        assert [(a["number"], a["exit_code"], a["outcome"]) for a in shown["attempts"]] == [
            a[:3] for a in attempts.get(job.id, [])
        ], f"{where}: job {job.id}"

    check_nothing_left(box, where)


def check_nothing_left(box: QueueBox, where: str) -> None:
    """With every job ended, only the daemon and its spawner remain; once it stops, nothing."""
    keep = set(_procs(box, "daemon")) | set(_procs(box, "spawner"))
    left: dict[int, str] = {}

    def only_daemon() -> bool:
        left.clear()
        left.update({p: n for p, n in box.processes().items() if p not in keep})
        return not left

    with suppress(AssertionError):
        wait_until(only_daemon, 10, "idle supervisors to exit")
    assert not left, f"{where}: processes left running after every job ended: {left}"
    stopped = box("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    with suppress(AssertionError):
        wait_until(lambda: not box.processes(), 10, "the daemon and its spawner to exit")
    assert not box.processes(), f"{where}: left after the daemon stopped: {box.processes()}"
