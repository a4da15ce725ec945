"""What queue commands do, without a UI: open the store, wake or start the daemon, stop jobs,
wait for them, and read their logs. The CLI only parses and renders."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.paths import Paths, absolute, ensure_private_dir, private_dir_problem
from gpubox.queue import proctree
from gpubox.queue.jobs import END_STATES, Job
from gpubox.queue.layout import (
    DAEMON_LOG,
    STARTING_NAME,
    attempt_prefix,
    db_path,
    lock_holder,
    log_paths,
    logs_dir,
    socket_path,
    socket_problem,
)
from gpubox.queue.store import JobStore, StoreError
from gpubox.queue.wire import Unreachable, ask, poke


def open_store(paths: Paths) -> JobStore:
    try:
        return JobStore(db_path(paths))
    except StoreError as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    except PermissionError as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None


def check_daemon_start(paths: Paths, env: Mapping[str, str] | None = None) -> Paths:
    """What a daemon started now would stop on, as GpuboxError: bad settings, a socket no daemon
    could listen on (exit 2), a folder not fit to be its own (exit 1). Its folders, absolute (it
    works from /, so a setting relative to this client's directory goes to it resolved)."""
    from gpubox.config import load_config

    whole = absolute(paths)
    load_config(env=dict(os.environ if env is None else env), paths=whole)  # as gpubox/cli/daemon_run.py reads them
    problem = socket_problem(whole)
    if problem is not None:
        raise GpuboxError(problem, ExitCode.USAGE)
    for folder in (whole.state_dir, whole.runtime_dir):  # the daemon would stop on them at once
        problem = private_dir_problem(folder)
        if problem is not None:
            raise GpuboxError(problem, ExitCode.FAILED)
    return whole


def start_daemon(paths: Paths, env: Mapping[str, str] | None = None) -> int | None:
    """Start `gpubox daemon` in the background, in its own session, logging to the state dir; its
    pid, or None when another client is starting one right now (or one runs already).
    GpuboxError (exit 2) when its settings are bad: it would only say so in its log and exit."""
    import subprocess

    daemon_env = dict(os.environ if env is None else env)
    whole = check_daemon_start(paths, daemon_env)
    ensure_private_dir(paths.state_dir)
    starting = os.open(paths.state_dir / STARTING_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(starting, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another client's daemon is starting: it holds this until it dies
        if lock_holder(paths) is not None:
            return None  # one took its lock since this client looked
        for name, path in (
            ("GPUBOX_STATE_DIR", whole.state_dir),
            ("GPUBOX_RUNTIME_DIR", whole.runtime_dir),
            ("GPUBOX_SYSTEM_CONFIG", whole.system_config_file),
        ):
            if daemon_env.get(name):
                daemon_env[name] = str(path)
        home = daemon_env.get("HOME", "")
        if home and not os.path.isabs(home):  # the folders under it are this client's, not /'s
            daemon_env["HOME"] = os.path.abspath(home)
        log = os.open(paths.state_dir / DAEMON_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            # The daemon inherits the lock on `starting` and keeps it open (never reading it) for
            # its life: no other client starts one while it gets ready or runs.
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpubox", "daemon"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=daemon_env,
                cwd="/",
                pass_fds=(starting,),
            )
        finally:
            os.close(log)
    finally:
        os.close(starting)
    return proc.pid


def daemon_starting(paths: Paths) -> bool:
    """Whether a daemon a client started holds `daemon.starting` (it does from its launch to its
    end), so is on its way even before it takes its lock."""
    try:
        fd = os.open(paths.state_dir / STARTING_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # never started by a client here
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: a starting client's is exclusive
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # and with it, the shared lock just taken
    return False


def start_daemon_early(paths: Paths) -> bool:
    """Start the daemon now when none runs, before the jobs it is started for are stored: its
    start (a Python of its own) then overlaps the client's writing, and the first job of a cold
    queue starts sooner. Its first pass comes after it listens, so it sees jobs stored before
    that, and a poke brings it to those stored after. True when it was started here."""
    if lock_holder(paths) is not None:
        return False
    try:
        start_daemon(paths)
    except OSError:
        return False  # wake_daemon tries again once the jobs are stored, and says why it fails
    return True


WAITS_FOR_DAEMON = "queued jobs wait until `gpubox daemon` runs"


def wake_daemon(paths: Paths, started: bool = False, waits: str = WAITS_FOR_DAEMON) -> str:
    """Ask the daemon to look at the queue now, starting it when none runs; what happened.
    `started`: this client started one already (start_daemon_early), which may not hold its
    lock yet: it is not started twice. `waits`: what waits for a daemon when none can start."""
    if poke(socket_path(paths)):
        return "woken"
    if started and not daemon_starting(paths) and lock_holder(paths) is None:
        started = False  # the one started early has ended already (its log says why): once more
    if not started:
        if lock_holder(paths) is not None:
            return "starting"  # it holds the lock but does not listen yet
        try:
            start_daemon(paths)
        except (OSError, GpuboxError) as exc:  # a process limit, a log it cannot open, a bad setting
            why = exc.message if isinstance(exc, GpuboxError) else exc.strerror or str(exc)
            message = f"could not start the daemon ({why}): {waits}"
            raise GpuboxError(message, ExitCode.DAEMON_UNREACHABLE) from None
    if os.environ.get("GPUBOX_JOB_ID"):
        # Started from inside a job, the daemon is adopted by that job's supervisor, which spares
        # it when the job ends only once it holds its lock: do not let the job end before that.
        deadline = time.monotonic() + 10.0
        while lock_holder(paths) is None and time.monotonic() < deadline:
            time.sleep(0.02)
    return "started"


def daemon_view(paths: Paths) -> dict[str, object] | None:
    """The daemon's live view (why each job waits, GPU indexes), or None when none answers."""
    try:
        return ask(socket_path(paths), "view", timeout=2.0)
    except Unreachable:
        return None


# Stopping jobs


@dataclass(frozen=True)
class StopResult:
    job: Job
    action: str  # "cancelled", "stopping", "ended already"


def signal_supervisor(job: Job, sig: int) -> bool:
    """Signal a running job's supervisor, never a process that merely reuses its pid."""
    if job.pid is None or not proctree.is_alive(job.pid, job.pid_start):
        return False
    try:
        os.kill(job.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def cancel_jobs(store: JobStore, ids: Sequence[int]) -> list[StopResult]:
    """Cancel queued jobs and stop running ones (their supervisor stops the whole tree)."""
    for job_id in ids:
        store.require(job_id)  # every id exists, or nothing changes
    results = []
    for job_id in ids:
        before = store.require(job_id)
        if before.state in END_STATES:
            results.append(StopResult(before, "ended already"))
            continue
        job = store.request_stop(job_id, "cancel")
        if job.state == "cancelled":
            results.append(StopResult(job, "cancelled"))
        elif job.state == "running":
            signal_supervisor(job, signal.SIGTERM)
            results.append(StopResult(job, "stopping"))
        else:
            results.append(StopResult(job, "ended already"))
    return results


# Waiting


FAST_POLL_S = 0.01
SLOW_POLL_S = 0.1
SHORT_LINE = 100  # queued jobs, and jobs left to end, at most, for `queue wait` to look again soon after a commit


def wait_jobs(
    store: JobStore,
    ids: Sequence[int],
    timeout_s: float | None,
    on_poll: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[], object] = lambda: None,
) -> dict[int, tuple[str, int | None]] | None:
    """Block until every job has ended; then each job's state and exit code, in the order of
    `ids`, or None when the timeout ran out first. ValueError when a job does not exist (before
    anything else: `on_wait`, called once every id is known to exist if a job has not ended)."""
    # The version first, the states after: an end committed between the two is seen at the
    # first look (the other way round, it could be missed until some later commit).
    version = store.data_version()
    ends = _ends(store, ids, ValueError, "does not exist")
    waiting = [i for i in ids if ends[i][0] not in END_STATES]
    if not waiting:
        return {i: ends[i] for i in ids}
    on_wait()
    deadline = None if timeout_s is None else clock() + timeout_s
    delay = FAST_POLL_S
    while True:
        store.check_current()
        if deadline is not None and clock() >= deadline:
            return None
        on_poll()
        pause = delay if deadline is None else max(0.0, min(delay, deadline - clock()))
        sleep(pause)
        delay = min(delay * 1.5, SLOW_POLL_S)
        # The jobs are read again only when something committed since (a cheap question), and
        # only those not seen ended. Soon after a commit (every 10 ms while the queue is busy)
        # when few jobs are left to end and one of them runs or few jobs are queued, so that a
        # short job is seen to end at once; otherwise, as while it is quiet, less and less often,
        # up to every 0.1 s: behind a long line, or with many jobs left, the end is not near, and
        # each look took CPU from the jobs that run (a stream of 1,000 was 3% slower; waited for
        # all, 6%).
        now = store.data_version()
        if now == version:
            continue
        version = now
        ends = _ends(store, waiting)
        waiting = [i for i in waiting if ends[i][0] not in END_STATES]
        if not waiting:
            # All seen ended: read again at once, so that they are told as one moment saw them
            # (a `queue retry` meanwhile put one back in the queue: wait for it again).
            ends = _ends(store, ids)
            waiting = [i for i in ids if ends[i][0] not in END_STATES]
            if not waiting:
                return {i: ends[i] for i in ids}
        if len(waiting) <= SHORT_LINE and (
            any(ends[i][0] == "running" for i in waiting) or store.queued_count(SHORT_LINE + 1) <= SHORT_LINE
        ):
            delay = FAST_POLL_S


def _ends(
    store: JobStore,
    ids: Sequence[int],
    missing: Callable[[str], Exception] = lambda why: GpuboxError(why, ExitCode.FAILED),
    why: str = "was removed (queue clean) before it ended",
) -> dict[int, tuple[str, int | None]]:
    ends = store.ends(ids)
    gone = [i for i in ids if i not in ends]
    if gone:
        raise missing(f"job {gone[0]} {why}")
    return ends


def exit_code_for(ends: Iterable[tuple[str, int | None]]) -> int:
    """What `queue wait` exits with, from each job's state and exit code: 0 when all succeeded,
    else the first failed job's own code."""
    for state, exit_code in ends:
        if state != "succeeded":
            if exit_code is not None and exit_code != 0:
                return min(exit_code, 255)
            return int(ExitCode.FAILED)
    return 0


# Logs


def attempt_log(paths: Paths, job: Job, attempt: int | None, stderr: bool) -> Path:
    number = attempt if attempt is not None else job.attempt
    out, err, _ = log_paths(attempt_prefix(logs_dir(paths), job.id, number))
    return err if stderr else out


def each_attempt(attempt_now: Callable[[], int], log_of: Callable[[int], Path]) -> Callable[[], Path | None]:
    """For `follow`: the log to read now. The latest attempt's at the first look, then each later
    attempt's in turn, so one that began and ended between two looks (a quick failure, retried)
    is read too; None while the job has not started."""
    shown: list[int] = []

    def path() -> Path | None:
        latest = attempt_now()
        if not shown:
            shown.append(latest)
        elif shown[0] < latest:
            shown[0] += 1
        return log_of(shown[0]) if shown[0] else None

    return path


def follow(
    path_for: Callable[[], Path | None],
    done: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """Chunks of a growing log until the job ends and the file is drained; follows new attempts.
    `path_for` is asked once a step: it may move on to the next attempt each time (`each_attempt`),
    so asking it twice for one step would skip one."""
    current: Path | None = None
    offset = 0
    seen: tuple[int, int] | None = None  # the file read: a log removed and made again starts anew
    path = path_for()
    while True:
        if path != current:
            if current is not None:  # a new attempt: the one before ended, and its end is read first
                yield from _rest(current, offset)
            current, offset, seen = path, 0, None
        chunk = b""
        if current is not None:
            with suppress(FileNotFoundError), open(current, "rb") as fh:
                st = os.fstat(fh.fileno())
                if seen is not None and (seen != (st.st_dev, st.st_ino) or st.st_size < offset):
                    offset = 0  # (a new file may take the old one's inode number)
                seen = (st.st_dev, st.st_ino)
                fh.seek(offset)
                chunk = fh.read(1 << 16)
        if chunk:
            offset += len(chunk)
            yield chunk
        elif done():
            path = path_for()
            if path == current:
                if current is not None:  # what it wrote after the last read, before it ended
                    yield from _rest(current, offset)
                return
            continue  # a later attempt's log: read it next
        else:
            sleep(0.2)
        path = path_for()


def _rest(path: Path, offset: int) -> Iterator[bytes]:
    with suppress(FileNotFoundError), open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(1 << 16):
            yield chunk


def remove_logs(paths: Paths, ids: Sequence[int]) -> None:
    """Delete the log and exit files of every attempt of these jobs (`<id>.<attempt>.<kind>`).
    The folder is listed once: one listing per job made a clean of many jobs quadratic."""
    wanted = {str(job_id) for job_id in ids}
    try:
        names = os.listdir(logs_dir(paths))
    except FileNotFoundError:
        return
    for name in names:
        if name.split(".", 1)[0] in wanted:
            with suppress(FileNotFoundError):
                os.unlink(logs_dir(paths) / name)
