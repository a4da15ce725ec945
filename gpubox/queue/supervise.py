"""A job's supervisor: the process between the daemon and the job, which outlives the daemon.

The daemon forks supervisors ahead of time (spares). A spare leaves the daemon's session and
waits for its launch: one line, which it may get while the previous job still runs, to make the
pipes for the job's output and build its environment ahead. It runs the job only on the "go"
that follows, which the daemon sends only after recording the start (so a job never runs
unrecorded or twice). At EOF instead it runs nothing, unless the database says its start was
recorded (the daemon died between the two): then it runs the job, as "go" would have. It runs
the job in its own process group with its GPUs and environment, and copies the job's output
from those pipes to its logs (log_relay.py). It enforces the time limit and stops the whole
tree when asked: SIGTERM cancels, SIGUSR1 preempts. It never writes the database (it reads it
only on those rare paths, on a connection of its own): it tells the daemon how the job ended
over the done pipe and waits for the daemon's "recorded". Without it (the daemon was killed, or
could not record it) it leaves the outcome in `<log prefix>.exit`, a file written once, and the
next daemon records it from there. Killing or restarting the daemon loses nothing.

A supervisor runs one job at a time. Once the end is recorded it waits for another launch, so
a stream of short jobs does not pay a fork of Python each; but never after anyone asked to stop
its job, or its job was stopped (the daemon decides that as it records the end): a stop signal
meant for the job that ended must not reach the next one. It exits only at EOF on the launch
pipe (sent away, or the daemon gone), or when nobody records its job's end.

In a stream of short jobs the daemon also hands a supervisor the next job while its job runs
(NEXT, with that job's start recorded under this process): it starts it the moment its job
ends, before telling the daemon of that end, and says "on"; or drops it, saying "back", when
the daemon takes it back (REVOKE), when its own job was stopped, or when it was cancelled.
Two jobs are then recorded under one supervisor for a moment, so a stop signal is placed from
the database (the requests committed before their signals): a job handed on stops only when it
was asked to, never for a signal meant for the job before it (`_Chain.stop_is_for`).
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
from gpubox.queue.layout import attempt_prefix, lock_holder_at, log_paths
from gpubox.queue.log_relay import LogRelay, copy_while_waiting, pump_all, readable
from gpubox.queue.spawner import SHORT_SUCCESS
from gpubox.queue.wire import poke

TYPE_CHECKING = False  # typing is not imported at run time (every supervisor would)
if TYPE_CHECKING:
    from typing import Any

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
NEXT = b"N"  # then a launch line, while a job runs: run it when that job ends (its start is recorded)
REVOKE = b"R"  # take back the job handed on, if it has not started: it goes back to the queue
_ON = b" on "  # "<job> <attempt> on <started_at>": a job handed on has started (under this supervisor)
_BACK = b" back\n"  # "<job> <attempt> back": a job handed on was dropped before it ran


def prepare(spare: Spare, launch: Launch) -> None:
    """Give a spare a job to get ready for without running it: it makes the pipes for the job's
    output and builds its environment, then waits. `go` (once the start is recorded) runs it; `discard` sends it away.
    The pipe is closed on failure (OSError)."""
    _send(spare, _launch_line(launch))


def hand_on(supervisor: Spare, launch: Launch, recorded: bool = False) -> None:
    """Hand a supervisor whose job runs the next job, whose start is recorded under its pid: it
    runs it the moment its job ends, and answers "on" (or "back" if it never does). `recorded`:
    say first that the end it told last is recorded. OSError when it is gone (the pipe is closed)."""
    _send(supervisor, (RECORDED if recorded else b"") + NEXT + _launch_line(launch))


def revoke(supervisor: Spare) -> bool:
    """Take back the job handed on, if it has not started (the supervisor answers "back"); False
    when the supervisor is gone."""
    try:
        _send(supervisor, REVOKE)
    except OSError:
        return False
    return True


def parse_chain(line: bytes) -> tuple[int, int, float | None] | None:
    """A job handed on that started ("on": when) or was dropped ("back": None), or None for a
    line that says neither (a done message)."""
    parts = line.split(b" ")
    try:
        if len(parts) == 4 and parts[2] == _ON.strip():
            started = float(parts[3])
            return (int(parts[0]), int(parts[1]), started) if math.isfinite(started) else None
        if len(parts) == 3 and parts[2] == _BACK.strip():
            return int(parts[0]), int(parts[1]), None
    except ValueError:
        pass
    return None


def _launch_line(launch: Launch) -> bytes:
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
    return data + b"\n"  # JSON escapes newlines: the launch is one line


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


class _Chain:
    """A supervisor's dealings with its daemon across jobs: the orders it reads, the ends it told
    and waits to hear recorded, and the job handed on (NEXT) to run as soon as the one running
    ends, without a word with the daemon in between (its start is recorded before it is handed
    on). The daemon takes one back (REVOKE) when the running job does not end soon; this process
    then answers "back" and never runs it."""

    def __init__(self, orders: _Orders, done_w: int, short_success: bool) -> None:
        self.orders = orders
        self.done_w = done_w
        self.short_success = short_success
        self.unrecorded: list[tuple[Launch, Outcome, float]] = []  # ends told, and until when to wait
        self.pending: tuple[Launch, _Ready | OSError] | None = None
        # The last jobs it ran or dropped: a stop signal still on its way may be one of theirs.
        self.recent: list[Launch] = []
        self.closed = False  # no more orders: EOF, or a daemon that did not answer in time
        # A job of its was stopped (or never ran): it runs no job handed on after that, as the
        # daemon keeps no such supervisor (another stop signal may be on its way).
        self.stopped = False
        self.eof = False  # the daemon closed its end: it records no start under this process again
        self.current: Launch | None = None  # the job running
        self.asked: set[tuple[int, int]] = set()  # attempts a stop signal was placed on, not (yet) here

    def fd(self) -> list[int]:
        """What to watch while a job runs."""
        return [] if self.closed else [self.orders.fd]

    def deadline(self) -> float | None:
        return self.unrecorded[0][2] if self.unrecorded and not self.closed else None

    def on_readable(self) -> None:
        """Orders came while a job runs: act on them (EOF: the daemon is gone)."""
        if not self.orders._fill():
            self.eof = True
            self._close()
        self._act()

    def expire(self) -> None:
        deadline = self.deadline()
        if deadline is not None and time.monotonic() >= deadline:
            self._close()  # a daemon that does not answer: nothing it says is waited for again

    def _act(self) -> None:
        buf = self.orders.buf
        while buf:
            first = buf[:1]
            if first == RECORDED and self.unrecorded:
                self.unrecorded.pop(0)
            elif first == REVOKE:
                if self.pending is not None:
                    self.drop_pending("taken back by the daemon before it ran")
            elif first == NEXT:
                if b"\n" not in buf:
                    return  # the rest is on its way
                self.orders.buf = buf[1:]
                launch = self.orders.launch()
                assert launch is not None
                self.pending = (launch, _ready(launch))
                if (launch.job_id, launch.attempt) in self.asked:  # its cancel's signal came before it did
                    self.drop_pending("cancelled before it ran")
                buf = self.orders.buf
                continue
            else:
                return  # a launch or "go": for next_job
            buf = self.orders.buf = buf[1:]

    def _close(self, telling: Launch | None = None) -> None:
        """The daemon is gone, or silent: the ends it was told go to exit records, for the next.
        `telling`: a job whose end is being told (its record follows)."""
        if self.closed:
            return
        self.closed = True
        if not self.eof:
            # Heard no more, the daemon is not to hand anything over either: its next write fails
            # (and undoes the start it made for it), rather than wait in a pipe nobody reads.
            with suppress(OSError):
                os.close(self.orders.fd)
        told, self.unrecorded = self.unrecorded, []
        for launch, result, _ in told:
            _leave_exit_record(launch, result)
        # Idle with every end heard recorded and no order begun, nothing can be recorded here that
        # this process does not know of (a start goes with the order, or with the end it follows).
        if told or telling or self.current or self.pending or self.orders.buf[:1] == NEXT:
            self.never_came(*(launch for launch, _, _ in told), *([telling] if telling else []))
        if told:
            poke(told[-1][0].socket_path)

    def never_came(self, *also: Launch) -> None:
        """Jobs recorded as started under this process whose order never came (the daemon
        stopped between the two, or this process stopped listening): each gets an exit record
        that says it did not run, and is queued again by the next daemon, once this process is
        gone. Not the jobs it ran, runs, holds, or dropped (`also`: more of them)."""
        pending = self.pending[0] if self.pending else None
        mine = [launch for launch in (self.current, pending, *self.recent, *also) if launch is not None]
        if not mine:
            return  # nothing known: no database to read (a spare that never had a job has none)
        seen = {(launch.job_id, launch.attempt) for launch in mine}
        for job_id, attempt in _recorded_here(mine[-1]):
            if (job_id, attempt) not in seen:
                prefix = attempt_prefix(mine[-1].log_prefix.parent, job_id, attempt)
                never = Outcome(None, "cancelled", "the daemon stopped before handing it over", time.time(), False)
                with suppress(OSError):
                    write_exit(log_paths(prefix)[2], attempt, never)

    def _write(self, message: bytes) -> bool:
        if self.closed:
            return False
        with suppress(OSError):  # EPIPE when the daemon that asked for us is gone; EAGAIN when full
            return os.write(self.done_w, message) == len(message)
        return False

    def done_with(self, launch: Launch) -> None:
        """A job this process ran, or dropped: for placing a stop signal that comes after."""
        self.recent = [*self.recent[-3:], launch]

    def drop_pending(self, reason: str) -> None:
        """Never run the job handed on; say so ("back"). Its exit record says it did not run, for a
        daemon that misses the line: it queues it again, or ends it cancelled if that was asked."""
        assert self.pending is not None
        (launch, ready), self.pending = self.pending, None
        self.done_with(launch)
        self.asked.discard((launch.job_id, launch.attempt))
        if not isinstance(ready, OSError):
            ready.close()
        dropped = Outcome(None, "cancelled", reason, time.time(), False)
        with suppress(OSError):
            write_exit(log_paths(launch.log_prefix)[2], launch.attempt, dropped)
        if not self._write(b"%d %d%s" % (launch.job_id, launch.attempt, _BACK)):
            self._close()  # its exit record says it: the next daemon queues it again

    def take_next(self, result: Outcome) -> tuple[Launch, _Ready | OSError] | None:
        """The job handed on, to start now that `result` ended the one before; None when there is
        none or it may not run: after a stop (a stop signal meant for one job must not reach the
        next), or with no daemon, unless its start is recorded."""
        if self.pending is None:
            return None
        if _stops:
            self.stop_is_for(None, False)  # the one handed on, if anyone asked it to stop
        if self.pending is not None and (self.pending[0].job_id, self.pending[0].attempt) in self.asked:
            self.drop_pending("cancelled before it ran")
        if self.pending is None:
            return None
        if _stops or not _ended_by_itself(result):
            self.drop_pending("its supervisor was stopped before it ran")
            return None
        if self.closed and not start_recorded(self.pending[0]):
            self.drop_pending("its start was not recorded")
            return None
        nxt, self.pending = self.pending, None
        return nxt

    def tell_end(self, launch: Launch, result: Outcome, started: Launch | None, started_at: float = 0.0) -> None:
        """Tell the daemon how a job ended (and that the next one, handed on, started then); without
        a daemon to tell, leave its exit record."""
        self.stopped = self.stopped or not _ended_by_itself(result)
        done = done_message(launch.job_id, launch.attempt, result, self.short_success)
        told = True
        if started is not None:
            on = b"%d %d%s%r\n" % (started.job_id, started.attempt, _ON, started_at)
            if len(on) + len(done) <= select.PIPE_BUF:
                done = on + done  # one wake-up of the daemon, not two
            else:
                told = self._write(on)
        if told and self._write(done):
            self.unrecorded.append((launch, result, time.monotonic() + RECORDED_WAIT_S))
            return
        self._close(telling=launch)
        _leave_exit_record(launch, result)
        poke(launch.socket_path)

    def stop_is_for(self, current: Launch | None, handed: bool) -> bool:
        """A stop signal came: whom it is for, from the requests in the database (a cancel is
        committed before its signal is sent), among the jobs recorded under this process (one
        handed on may be recorded before its order is read) and those it ran or dropped last. A
        job handed on that was asked is dropped. True when the running job must stop: it was asked, or nobody
        was and it was started the usual way (someone's own `kill`); a job handed on stops only
        when asked (the signal was for the job before, which has ended)."""
        pending = self.pending[0] if self.pending is not None else None
        where = pending or current or (self.recent[-1] if self.recent else None)
        recent = [r.job_id for r in self.recent if current is None or r.job_id != current.job_id]
        asked = _requests(where, recent) if where is not None else None
        if asked is None:  # the database cannot tell: as before jobs were handed on
            if pending is not None:
                self.drop_pending("its supervisor was stopped before it ran")
            return current is not None
        current_asked = current is not None and asked.pop((current.job_id, current.attempt), None) is not None
        if pending is not None and asked.get((pending.job_id, pending.attempt)) is not None:
            self.drop_pending("cancelled before it ran")
        # One recorded here but not handed on yet is dropped when it comes (see _act).
        self.asked |= {key for key, request in asked.items() if request is not None}
        others_asked = any(request is not None for request in asked.values())
        if current is None:
            if others_asked:
                del _stops[:]  # for the job handed on, dropped now
            return False
        if current_asked or (not handed and not others_asked):
            return True
        del _stops[:]  # for another job of this process's, or for the one before (ended)
        return False

    def next_job(self) -> tuple[Launch, _Ready | OSError, bool] | None:
        """Idle: the next job to run and whether it was handed on, once its start is recorded
        ("go", or NEXT; at EOF, the database); None when there is none (sent away, the daemon
        gone). Until then, the ends told are heard recorded."""
        while True:
            if self.pending is not None:
                if self.stopped or _stops:
                    self.drop_pending("its supervisor was stopped before it ran")
                    continue
                if self.closed and not start_recorded(self.pending[0]):
                    self.drop_pending("its start was not recorded")
                    continue
                (launch, ready), self.pending = self.pending, None
                if not self._write(b"%d %d%s%r\n" % (launch.job_id, launch.attempt, _ON, time.time())):
                    self._close(telling=launch)  # a daemon not told is not listened to again
                return launch, ready, True
            if self.closed:
                return None
            self._act()
            first = self.orders.buf[:1]
            if first not in (b"", b"{", NEXT):
                self.orders.buf = self.orders.buf[1:]  # a "go" for nothing: not a launch
                continue
            if first != b"{":  # nothing yet, or a job handed on that is still on its way
                deadline = self.deadline()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                if timeout is not None and not select.select([self.orders.fd], [], [], timeout)[0]:
                    self._close()  # (select retries a call a signal cut short, with the time left)
                else:
                    self.on_readable()
                continue
            plain = self.orders.launch()
            if plain is None:
                self.closed = self.eof = True
                return None  # a launch cut short: sent away
            proctree.set_name(f"gpubox-job{plain.job_id}")
            prepared = _ready(plain)
            # EOF instead of "go": sent away, or the daemon died, before or after it recorded the
            # start. Recorded, the job is this process's to run, as if "go" had come: it runs
            # once, and a later daemon records its end.
            if not self.orders.expect(GO) and not start_recorded(plain):
                if not isinstance(prepared, OSError):
                    prepared.close()
                self.closed = self.eof = True
                return None  # no start was recorded: run nothing
            return plain, prepared, False


def _read_db(launch: Launch, sql: str, params: tuple[object, ...]) -> list[tuple[Any, ...]] | None:
    """Rows from the queue's database, read only, on a connection of this process's own; None
    when it cannot be read. Only on rare paths: sqlite3 is imported here, not in every supervisor."""
    if launch.db_path is None:
        return None
    import sqlite3

    try:
        db = sqlite3.connect(f"{launch.db_path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
        try:
            return [tuple(row) for row in db.execute(sql, params).fetchall()]
        finally:
            db.close()
    except sqlite3.Error:
        return None


def _recorded_here(launch: Launch) -> list[tuple[int, int]]:
    """The attempts the database records as running under this process."""
    me = os.getpid()
    sql = "SELECT id, attempt FROM jobs WHERE state = 'running' AND pid = ? AND (pid_start IS NULL OR pid_start = ?)"
    return [(int(i), int(n)) for i, n in _read_db(launch, sql, (me, proctree.start_ticks(me))) or []]


def _ended_by_itself(result: Outcome) -> bool:
    return result.ran and result.outcome in ("succeeded", "failed")


def _requests(launch: Launch, recent: list[int]) -> dict[tuple[int, int], str | None] | None:
    """The stop asked of each job recorded as running under this process, and of the `recent`
    ones it ran or dropped (only when a stop signal must be placed); None when the database
    cannot tell. A job cancelled already counts as asked (its request is cleared as its end is
    recorded). By attempt: a job run again is another."""
    marks = ",".join("?" * len(recent))
    rows = _read_db(
        launch,
        f"SELECT id, attempt, request, state FROM jobs WHERE (state = 'running' AND pid = ?) OR id IN ({marks})",
        (os.getpid(), *recent),
    )
    if rows is None:
        return None
    return {
        (int(i), int(n)): (str(r) if r else None) or ("cancel" if st == "cancelled" else None) for i, n, r, st in rows
    }


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
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    # A job's end (SIGCHLD), or a stop signal, wakes the wait in _run; set once, not per job. Idle,
    # nothing is waited for: what a signal writes then only wakes the next job's wait once more.
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    chain = _Chain(_Orders(launch_r), done_w, short_success)
    while True:
        job = chain.next_job()
        if job is None:
            if chain.closed and not chain.eof:
                # It stopped listening to a daemon that may still be there, and may have recorded
                # another start under this process since: never to run, as the next daemon learns.
                chain.never_came()
            return 0  # nothing to run, nothing to tell: sent away, or the daemon is gone
        launch, ready, handed = job
        chain.current = launch
        started: int | Outcome | None = None
        started_at = 0.0
        while True:  # one job, then each handed on while it ran
            proctree.set_name(f"gpubox-job{launch.job_id}")
            try:
                if isinstance(ready, OSError):
                    ready = _ready(launch)  # prepared long before, maybe: what counts is now
                if isinstance(ready, OSError):  # a read-only file system, a file for a folder: it fails, saying why
                    where = launch.log_prefix.parent
                    result = Outcome(None, "failed", f"its logs cannot be opened in {where}: {ready.strerror or ready}")
                elif isinstance(started, Outcome):
                    result = started
                else:
                    result = _run(launch, ready, wake_r, chain, handed, started)
                if result.ended_at is None:  # (built anew: dataclasses.replace costs several times more)
                    result = Outcome(result.exit_code, result.outcome, result.reason, time.time(), result.ran)
                after = chain.take_next(result)
                if after is not None:
                    # The next job first (its start is recorded): the end is told once it runs.
                    next_launch, next_ready = after
                    if isinstance(next_ready, OSError):
                        next_ready = _ready(next_launch)
                    started = _spawn(next_ready) if not isinstance(next_ready, OSError) else None
                    started_at = time.time()
                    chain.current = next_launch  # (what runs now, should the end below not be told)
            finally:
                if not isinstance(ready, OSError):
                    ready.close()
            chain.done_with(launch)
            chain.tell_end(launch, result, None if after is None else after[0], started_at)
            if after is None:
                break
            launch, ready, handed = next_launch, next_ready, True
            chain.current = launch
        chain.current = None
        # Idle: out of the job's directory (it would keep a file system busy), under a name
        # that says so. A stop signal that comes now is noted: the next job is then reported
        # stopped before it ran (and queued again); the daemon keeps no supervisor that was
        # stopped. Exiting instead could leave a job just handed over recorded as running.
        os.chdir("/")
        proctree.set_name("gpubox-idle")


def start_recorded(launch: Launch) -> bool:
    """Whether the database says this process runs the launch's attempt (only when "go" did
    not come)."""
    rows = _read_db(launch, "SELECT state, attempt, pid FROM jobs WHERE id = ?", (launch.job_id,))
    return rows is not None and rows[:1] == [("running", launch.attempt, os.getpid())]


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


def _run(
    launch: Launch,
    ready: _Ready,
    wake_r: int,
    chain: _Chain | None = None,
    handed: bool = False,
    started: int | None = None,
) -> Outcome:
    """Run the job (or watch it, `started` already) to its end. `chain`: orders to act on
    meanwhile; `handed`: it was handed on (a stop signal counts only when it was asked one)."""
    err = ready.err
    if started is None and _stops and (chain is None or chain.stop_is_for(launch, handed)):
        # asked to stop before the job ever ran: it does not run
        if signal.SIGUSR1 in _stops:
            return Outcome(None, "preempted", "stopped to make room for an infer job before it ran", time.time(), False)
        return Outcome(None, "cancelled", "stopped by SIGTERM before it ran", time.time(), False)
    job_pid = _spawn(ready) if started is None else started
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
        if _stops and (chain is None or chain.stop_is_for(launch, handed)):
            stopped_for = "preempt" if signal.SIGUSR1 in _stops else "cancel"
            proctree.stop_tree(me, job_pid, launch.grace_s, reaped, ready.wait, _daemon(launch))
            break
        if deadline is not None and time.monotonic() >= deadline:
            stopped_for = "timeout"
            err.note(f"time limit of {limit_text} reached; stopping the job")
            proctree.stop_tree(me, job_pid, launch.grace_s, reaped, ready.wait, _daemon(launch))
            break
        wait = 5.0 if deadline is None else max(0.0, min(5.0, deadline - time.monotonic()))
        told_by = chain.deadline() if chain is not None else None
        if told_by is not None:
            wait = max(0.0, min(wait, told_by - time.monotonic()))
        orders = chain.fd() if chain is not None else []
        with suppress(InterruptedError):
            ready_fds = select.select([wake_r, *orders, *readable(ready.relays)], [], [], wait)[0]
        if chain is not None:
            if orders and orders[0] in ready_fds:
                chain.on_readable()
            chain.expire()
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
