"""A job's supervisor: the process between the daemon and the job, which outlives the daemon.

The daemon forks supervisors ahead of time (spares). A spare leaves the daemon's session and
waits for its launch: one line, which it may get while the previous job still runs, to make the
pipes for the job's output and build its environment ahead. It runs the job only on the "go"
that follows, which the daemon sends only after recording the start (so a job never runs
unrecorded or twice). At EOF instead it runs nothing, unless the database says its start was
recorded (the daemon died between the two): then it runs the job, as "go" would have. It runs
the job in its own process group with its GPUs and environment, and copies the job's output
from those pipes to its logs (log_relay.py). It enforces the time limit and stops the whole
tree when asked: SIGTERM cancels, SIGUSR1 preempts. It never writes the database (and reads it
only in that one case, on a connection of its own): it tells the daemon how the job ended over
the done pipe and waits for the daemon's "recorded". Without it (the daemon was killed, or
could not record it) it leaves the outcome in `<log prefix>.exit`, a file written once, and the
next daemon records it from there. Killing or restarting the daemon loses nothing.

A supervisor runs one job at a time. Once the end is recorded it waits for another launch, so
a stream of short jobs does not pay a fork of Python each; but never after anyone asked to stop
its job, or its job was stopped (the daemon decides that as it records the end): a stop signal
meant for the job that ended must not reach the next one. It exits only at EOF on the launch
pipe (sent away, or the daemon gone), or when nobody records its job's end.
"""

from __future__ import annotations

import errno
import json
import math
import os
import select
import signal
import stat
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from gpubox.format import span
from gpubox.probe.launch import probe_environment, without_probe
from gpubox.queue import proctree
from gpubox.queue.jobs import JobSpec, spec_from_json, spec_to_json
from gpubox.queue.layout import lock_holder_at, log_paths
from gpubox.queue.log_relay import LogRelay, copy_while_waiting, pump_all, readable
from gpubox.queue.spawner import SHORT_SUCCESS
from gpubox.queue.wire import poke

NOT_FOUND = 127
NOT_EXECUTABLE = 126


@dataclass(frozen=True)
class Launch:
    job_id: int
    attempt: int  # the number this attempt will have
    spec: JobSpec
    gpu_uuids: tuple[str, ...]
    log_prefix: Path
    boot_id: str
    grace_s: float
    daemon_pid: int
    socket_path: Path
    lock_path: Path | None = None  # the daemon's lock: whoever holds it is never the job's to stop
    db_path: Path | None = None  # the queue's database, read only when "go" never came


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None
    outcome: str
    reason: str | None
    ended_at: float | None = None  # epoch seconds, when the supervisor saw the job end
    ran: bool = True  # False: stopped before the job was started at all


def job_environment(
    spec: JobSpec, job_id: int, attempt: int, gpu_uuids: tuple[str, ...], log_prefix: Path | None = None
) -> dict[str, str]:
    """The environment captured at submission, with the job's GPUs (by UUID) and its identity."""
    env = dict(spec.env)
    if log_prefix is not None:
        # The attempt's own mark, one queue's and one attempt's alone (unlike a job id, which
        # another queue may give too): what finds the processes it left when its supervisor dies.
        env["GPUBOX_JOB_LOG"] = str(log_prefix)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)  # empty for a CPU-only job: no GPU at all
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["GPUBOX_JOB_ID"] = str(job_id)
    env["GPUBOX_JOB_KIND"] = spec.kind
    env["GPUBOX_JOB_ATTEMPT"] = str(attempt)
    return probe_environment(env) if spec.probe else without_probe(env)


def job_argv(spec: JobSpec) -> list[str]:
    return ["/bin/sh", "-c", spec.argv[0]] if spec.shell else list(spec.argv)


@dataclass
class Spare:
    """A supervisor forked ahead of time, already out of the daemon's session, waiting for a job.

    Forking and preparing take longer than running a short job; a spare does it while the
    previous job runs. It reads one launch line from its pipe, prepares it, and runs it on "go";
    EOF instead (the daemon discarded it, or died) means exit without running anything.
    """

    pid: int
    pid_start: int | None
    launch_w: int


GONE = Spare(0, None, -1)  # no supervisor to talk to (sent away, or never known)

_STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


def fork_spare(done_w: int, short_success: bool = False) -> Spare:
    """Fork a spare supervisor (the spawner does); `done_w` is where it says "<job> <attempt>"
    when it is done (`short_success`: a success in a short line, which the daemon reads)."""
    launch_r, launch_w = os.pipe2(os.O_CLOEXEC)
    # A cancel that comes before the spare has its handlers waits, blocked, instead of killing it.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(launch_r)
        os.close(launch_w)
        raise
    if pid == 0:  # the supervisor
        code = 1
        try:
            os.close(launch_w)
            code = _spare_main(launch_r, done_w, short_success)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.close(launch_r)
    return Spare(pid, proctree.start_ticks(pid), launch_w)


_OK = f"{SHORT_SUCCESS} ".encode()  # a success in a short line: "<job> <attempt> ok <ended_at>"
GO = b"G"  # after the launch: run it (its start is recorded now)
RECORDED = b"A"  # after the done message: the end is recorded; wait for the next launch
RECORDED_WAIT_S = 30.0  # how long a supervisor waits for "recorded" before it leaves its exit record


def prepare(spare: Spare, launch: Launch) -> None:
    """Give a spare a job to get ready for without running it: it makes the pipes for the job's
    output and builds its environment, then waits. `go` (once the start is recorded) runs it; `discard` sends it away.
    The pipe is closed on failure (OSError)."""
    data = json.dumps(
        {
            "job_id": launch.job_id,
            "attempt": launch.attempt,
            "spec": spec_to_json(launch.spec),
            "gpu_uuids": list(launch.gpu_uuids),
            "log_prefix": str(launch.log_prefix),
            "boot_id": launch.boot_id,
            "grace_s": launch.grace_s,
            "daemon_pid": launch.daemon_pid,
            "socket_path": str(launch.socket_path),
            "lock_path": None if launch.lock_path is None else str(launch.lock_path),
            "db_path": None if launch.db_path is None else str(launch.db_path),
        }
    ).encode()
    _send(spare, data + b"\n")  # JSON escapes newlines: the launch is one line


def go(spare: Spare) -> None:
    """Run the job the spare prepared: only once its start is committed. OSError when the spare
    is gone (the pipe is closed then)."""
    _send(spare, GO)


def recorded(spare: Spare) -> bool:
    """Tell a supervisor that its job's end is recorded (it writes no exit record then, and
    waits for another launch); False when it is gone (the pipe is closed then)."""
    try:
        _send(spare, RECORDED)
    except OSError:
        return False
    return True


def discard(spare: Spare) -> None:
    """Send a supervisor away, prepared or idle: it reads EOF and exits without running anything
    (or, with a job running, exits when that ends, leaving its exit record)."""
    if spare.launch_w >= 0:
        with suppress(OSError):
            os.close(spare.launch_w)
        spare.launch_w = -1


def _send(spare: Spare, data: bytes) -> None:
    if spare.launch_w < 0:
        raise BrokenPipeError("the supervisor was sent away")
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(spare.launch_w, view) :]
    except OSError:
        discard(spare)
        raise


class _Orders:
    """The launch pipe as the supervisor reads it: launch lines, "go" and "recorded"."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def _fill(self) -> bool:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except InterruptedError:
                continue
            self.buf += chunk
            return bool(chunk)

    def launch(self) -> Launch | None:
        """The next launch, or None at EOF (discarded, or the daemon died, before a whole one)."""
        while b"\n" not in self.buf:
            if not self._fill():
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        d = json.loads(line)
        return Launch(
            job_id=d["job_id"],
            attempt=d["attempt"],
            spec=spec_from_json(d["spec"]),
            gpu_uuids=tuple(d["gpu_uuids"]),
            log_prefix=Path(d["log_prefix"]),
            boot_id=d["boot_id"],
            grace_s=d["grace_s"],
            daemon_pid=d["daemon_pid"],
            socket_path=Path(d["socket_path"]),
            lock_path=None if d.get("lock_path") is None else Path(d["lock_path"]),
            db_path=None if d.get("db_path") is None else Path(d["db_path"]),
        )

    def expect(self, byte: bytes, timeout_s: float | None = None) -> bool:
        """True when the next order is `byte`; False at EOF, on anything else, or when none
        comes within `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.buf:
            if deadline is not None and not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return False  # (select retries a call a signal cut short, with the time left)
            if not self._fill():
                return False
        first, self.buf = self.buf[:1], self.buf[1:]
        return first == byte


def _spare_main(launch_r: int, done_w: int, short_success: bool) -> int:
    os.setsid()  # out of the daemon's session: its terminal and its signals are not ours
    signal.set_wakeup_fd(-1)
    # From here a cancel (SIGTERM) or preemption (SIGUSR1) is noted, even before the job runs:
    # the daemon records this process as the job's supervisor before it hands the job over.
    signal.signal(signal.SIGTERM, _note_stop)
    signal.signal(signal.SIGUSR1, _note_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by fork_spare until now
    # Nothing the daemon held open (its lock, socket, database) may stay open here.
    low, high = sorted((launch_r, done_w))
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, 1 << 16)
    proctree.become_subreaper()
    orders = _Orders(launch_r)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    # A job's end (SIGCHLD), or a stop signal, wakes the wait in _run; set once, not per job. Idle,
    # nothing is waited for: what a signal writes then only wakes the next job's wait once more.
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        launch = orders.launch()
        if launch is None:
            return 0  # no start was recorded (or it is sent away while idle): run nothing
        proctree.set_name(f"gpubox-job{launch.job_id}")
        ready: _Ready | OSError = _ready(launch)
        try:
            # EOF instead of "go": sent away, or the daemon died, before or after it recorded the
            # start. Recorded, the job is this process's to run, as if "go" had come: it runs
            # once, and a later daemon records its end.
            if not orders.expect(GO) and not start_recorded(launch):
                return 0  # no start was recorded: run nothing
            if isinstance(ready, OSError):
                ready = _ready(launch)  # prepared long before, maybe: what counts is now
            if isinstance(ready, OSError):  # a read-only file system, a file for a folder: it fails, saying why
                where = launch.log_prefix.parent
                result = Outcome(None, "failed", f"its logs cannot be opened in {where}: {ready.strerror or ready}")
            else:
                result = _run(launch, ready, wake_r)
        finally:
            if not isinstance(ready, OSError):
                ready.close()
        if result.ended_at is None:  # (built anew: dataclasses.replace costs several times more)
            result = Outcome(result.exit_code, result.outcome, result.reason, time.time(), result.ran)
        told = False
        message = done_message(launch.job_id, launch.attempt, result, short_success)
        with suppress(OSError):  # EPIPE when the daemon that asked for us is gone; EAGAIN when full
            told = os.write(done_w, message) == len(message)
        # A daemon that does not answer in time (it failed to record, or hangs) gets the exit
        # record instead: the job's end is never left unrecorded behind a silent supervisor.
        if not (told and orders.expect(RECORDED, RECORDED_WAIT_S)):
            # Then the record a daemon that missed the message (killed, restarted) reads instead,
            # and a daemon woken to read it (once this process is gone: it then looks).
            _leave_exit_record(launch, result)
            poke(launch.socket_path)
            return 0
        # Idle: out of the job's directory (it would keep a file system busy), under a name
        # that says so. A stop signal that comes now is noted: the next job is then reported
        # stopped before it ran (and queued again); the daemon keeps no supervisor that was
        # stopped. Exiting instead could leave a job just handed over recorded as running.
        os.chdir("/")
        proctree.set_name("gpubox-idle")


def start_recorded(launch: Launch) -> bool:
    """Whether the database says this process runs the launch's attempt (read only, and only
    when "go" did not come: sqlite3 is imported here, not in every supervisor)."""
    if launch.db_path is None:
        return False
    import sqlite3

    try:
        db = sqlite3.connect(f"{launch.db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
        try:
            row = db.execute("SELECT state, attempt, pid FROM jobs WHERE id = ?", (launch.job_id,)).fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return False
    return row is not None and tuple(row) == ("running", launch.attempt, os.getpid())


def _record(result: Outcome) -> dict[str, object]:
    # json escapes text that is not UTF-8 (a file name, say); no reason is longer than a line.
    reason = result.reason if result.reason is None else result.reason[:1000]
    return {**result.__dict__, "reason": reason}


def _outcome(d: dict[str, object]) -> Outcome:
    code, reason, ended = d.get("exit_code"), d.get("reason"), d.get("ended_at")
    return Outcome(
        code if isinstance(code, int) else None,
        str(d["outcome"]),
        reason if isinstance(reason, str) else None,
        float(ended) if isinstance(ended, (int, float)) and math.isfinite(ended) else None,
        bool(d.get("ran", True)),
    )


def done_message(job_id: int, attempt: int, result: Outcome, short_success: bool = False) -> bytes:
    """One line, at most PIPE_BUF bytes so that it is written whole: "<job> <attempt> <json>", or
    with `short_success`, for a job that ran and succeeded, "<job> <attempt> ok <ended_at>" (most
    ends, on the way from one job to the next: no JSON to write or read). A long reason is cut
    further (JSON escapes make text that is not ASCII up to 6 times longer)."""
    r = result
    success = r.outcome == "succeeded" and r.exit_code == 0 and r.reason is None and r.ran
    if short_success and success and r.ended_at is not None and math.isfinite(r.ended_at):
        return b"%d %d %s%r\n" % (job_id, attempt, _OK, r.ended_at)
    record = _record(result)
    while True:
        line = f"{job_id} {attempt} {json.dumps(record)}\n".encode()
        reason = record["reason"]
        if len(line) <= select.PIPE_BUF or not isinstance(reason, str) or not reason:
            return line
        record = {**record, "reason": reason[: len(reason) // 2]}


def parse_done(line: bytes) -> tuple[int, int, Outcome] | None:
    try:
        job_id, attempt, body = line.split(b" ", 2)
        if body.startswith(_OK):
            ended = float(body[len(_OK) :])
            return (int(job_id), int(attempt), Outcome(0, "succeeded", None, ended)) if math.isfinite(ended) else None
        d = json.loads(body)
        return int(job_id), int(attempt), _outcome(d)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def write_exit(path: Path, attempt: int, result: Outcome) -> None:
    """Leave the outcome where a daemon that missed the done message looks for it.

    One small write, no fsync: the file only has to outlive the daemon, not the machine (after a
    power cut the job is `lost` whatever the file says). Written aside, then renamed: a write
    cut short (a full disk) leaves no record at all, never a part of one.
    """
    aside = Path(f"{path}.tmp")
    # O_NONBLOCK: a FIFO in the way fails the open instead of blocking it (a regular file: no change).
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        data = json.dumps({"attempt": attempt, **_record(result)}).encode()
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, "the exit record was cut short")
    except BaseException:
        os.close(fd)
        with suppress(OSError):
            os.unlink(aside)
        raise
    os.close(fd)
    os.replace(aside, path)


EXIT_RETRY_S = 5.0  # how often a supervisor tries again to leave its exit record (a full disk)
_FULL = {errno.ENOSPC, errno.EDQUOT}  # what clears once someone frees space


def _leave_exit_record(launch: Launch, result: Outcome) -> None:
    """The exit record, tried again while the disk is full: until it is on disk the outcome
    exists only in this process, and a supervisor that gave up would leave its job `lost`. Not
    for ever: not past an error that no freed space clears (a read-only file system, a state
    folder removed on purpose, which is not made again), nor past a stop signal (a cancel)."""
    path = log_paths(launch.log_prefix)[2]
    while True:
        try:
            write_exit(path, launch.attempt, result)
            return
        except FileNotFoundError:
            if path.parent.is_dir() or not path.parent.parent.is_dir():
                return  # the whole state folder is gone: nobody is left to read the record
            try:
                os.mkdir(path.parent, 0o700)  # only the logs folder, removed to free space
            except OSError:
                return
            continue
        except OSError as exc:
            if exc.errno not in _FULL or _stops:
                return
        time.sleep(EXIT_RETRY_S)


def read_exit(path: Path, attempt: int) -> Outcome | None:
    """The outcome a supervisor left for `attempt`, or None when there is none."""
    try:
        data = json.loads(path.read_text())
        if data.get("attempt") == attempt and data.get("outcome"):
            return _outcome(data)
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass
    return None


# Dispositions this process changed that the job must not inherit: an ignored signal stays
# ignored across exec (Python itself ignores SIGPIPE and SIGXFSZ).
_RESET = (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD)


def _ready(launch: Launch) -> _Ready | OSError:
    try:
        return _Ready(launch)
    except OSError as exc:
        return exc


def _logs_folder(folder: Path) -> None:
    """OSError when no log could be made in `folder` (a read-only file system, a file in its
    place): the job then fails saying so, rather than run with its output lost. A logs folder
    removed (to free space, say) is made again, but not a whole state folder removed on purpose."""
    try:
        mode = os.stat(folder).st_mode
    except FileNotFoundError:
        os.mkdir(folder, 0o700)
        return
    if not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
    if not os.access(folder, os.W_OK | os.X_OK):
        code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
        raise OSError(code, os.strerror(code), str(folder))


class _Ready:
    """What a spare prepares before it may run its job: the pipes for its output and the
    environment. Nothing here runs the job or writes to its logs, which are made only when
    something is written to them (log_relay.py), and the directory is entered only at "go": the
    job before may make, remove or replace it."""

    def __init__(self, launch: Launch) -> None:
        out_path, err_path, _ = log_paths(launch.log_prefix)
        _logs_folder(out_path.parent)
        self.out = LogRelay(out_path)
        try:
            self.err = LogRelay(err_path)
        except BaseException:
            self.out.close()
            raise
        self.relays = (self.out, self.err)
        spec = launch.spec
        self.cwd = spec.cwd
        self.argv = job_argv(spec)
        self.env = job_environment(spec, launch.job_id, launch.attempt, launch.gpu_uuids, launch.log_prefix)

    def wait(self, timeout_s: float) -> None:
        """A pause that keeps copying the job's output (for `stop_tree`)."""
        copy_while_waiting(self.relays, timeout_s)

    def close(self) -> None:
        for relay in self.relays:
            relay.close()


def _spawn(ready: _Ready) -> int | Outcome:
    """Start the job in its own process group, in its directory, with its logs; its pid."""
    out, err = ready.out, ready.err
    try:
        os.chdir(ready.cwd)  # this process exists for the job: the job inherits its directory
    except OSError:
        message = f"the working directory {ready.cwd} does not exist"
        err.note(message)
        return Outcome(None, "failed", message)
    argv, env = ready.argv, ready.env
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out.write_end, 1),
        (os.POSIX_SPAWN_DUP2, err.write_end, 2),
    ]
    for attempt_argv in (argv, None):
        if attempt_argv is None:
            import shutil  # only for a script without #!: shutil brings zlib, bz2 and lzma to every spawner

            run = ["/bin/sh", shutil.which(argv[0], path=env.get("PATH")) or argv[0], *argv[1:]]
        else:
            run = attempt_argv
        try:
            # posix_spawn: the C library's vfork and exec, no copy of this process's memory.
            pid = os.posix_spawnp(run[0], run, env, file_actions=actions, setpgroup=0, setsigdef=_RESET, setsigmask=())
            out.started()
            err.started()
            return pid
        except FileNotFoundError:
            message, code = f"{argv[0]}: command not found", NOT_FOUND
        except PermissionError:
            message, code = f"{argv[0]}: permission denied", NOT_EXECUTABLE
        except OSError as exc:
            message, code = f"{argv[0]}: {exc.strerror or exc}", NOT_EXECUTABLE
            if exc.errno == errno.ENOEXEC and attempt_argv is not None:
                continue  # a script without #!: a shell runs it, as a shell would
        except ValueError as exc:  # text that is not bytes (a job stored before that was refused)
            message, code = f"{argv[0]!r}: cannot be run: {exc}", NOT_EXECUTABLE
        break
    err.note(message)
    return Outcome(code, "failed", message)


_stops: list[int] = []  # signals asking this supervisor to stop its job


def _daemon(launch: Launch) -> frozenset[int]:
    """A daemon that the job's own `gpubox queue` commands started lands in the job's tree (this
    process adopts orphans): it, and the jobs it runs, are not the job's to stop."""
    holder = lock_holder_at(launch.lock_path) if launch.lock_path is not None else None
    return frozenset({holder}) if holder and holder > 0 else frozenset()


def _note_stop(signum: int, _frame: object) -> None:
    _stops.append(signum)


def _run(launch: Launch, ready: _Ready, wake_r: int) -> Outcome:
    err = ready.err
    if _stops:  # asked to stop before the job ever ran: it does not run
        if signal.SIGUSR1 in _stops:
            return Outcome(None, "preempted", "stopped to make room for an infer job before it ran", time.time(), False)
        return Outcome(None, "cancelled", "stopped by SIGTERM before it ran", time.time(), False)
    job_pid = _spawn(ready)
    if isinstance(job_pid, Outcome):
        return job_pid
    me = os.getpid()
    limit = launch.spec.time_limit_s
    deadline = time.monotonic() + limit if limit is not None else None
    limit_text = span(limit) if limit is not None else ""  # as --time-limit takes it: 2h, not 7200s
    status: int | None = None
    stopped_for: str | None = None

    def reaped(pid: int, st: int) -> None:
        nonlocal status
        if pid == job_pid:
            status = st

    while status is None:
        for pid, st in proctree.reap_children():
            reaped(pid, st)
        if status is not None:
            break
        if _stops:
            stopped_for = "preempt" if signal.SIGUSR1 in _stops else "cancel"
            proctree.stop_tree(me, job_pid, launch.grace_s, reaped, ready.wait, _daemon(launch))
            break
        if deadline is not None and time.monotonic() >= deadline:
            stopped_for = "timeout"
            err.note(f"time limit of {limit_text} reached; stopping the job")
            proctree.stop_tree(me, job_pid, launch.grace_s, reaped, ready.wait, _daemon(launch))
            break
        wait = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
        with suppress(InterruptedError):
            select.select([wake_r, *readable(ready.relays)], [], [], wait)
        pump_all(ready.relays)
        with suppress(OSError):
            os.read(wake_r, 512)
    # As a subreaper, this process inherits every orphan of the job: no child, no descendant.
    left = proctree.descendants(me, _daemon(launch)) if proctree.has_children() else set()
    if left:  # what the job left running would hold its GPUs: it ends with the job
        proctree.stop_tree(me, None, launch.grace_s, reaped, ready.wait, _daemon(launch))
        err.note(f"stopped {len(left)} process(es) the job left running")
    if status is None:  # killed so hard it was never reaped above
        with suppress(ChildProcessError):
            _, status = os.waitpid(job_pid, 0)
    code, signal_note = proctree.exit_code_of(status if status is not None else 9)
    if stopped_for == "timeout":
        return Outcome(code, "timeout", f"time limit of {limit_text} reached")
    if stopped_for == "preempt":
        return Outcome(code, "preempted", "stopped to make room for an infer job")
    if stopped_for == "cancel":
        return Outcome(code, "cancelled", "stopped by SIGTERM")
    if code == 0:
        return Outcome(0, "succeeded", None)
    return Outcome(code, "failed", signal_note or f"exit code {code}")
