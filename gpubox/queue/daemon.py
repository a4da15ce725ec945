"""The queue daemon: one per state directory, in the foreground, for systemd or a client to start.

It holds an exclusive lock beside the database, listens on a Unix socket in the runtime
directory, and runs a scheduling pass when a client pokes it, when a supervisor reports an end
(the done pipe), when another process commits to the database, and every poll interval while
jobs wait (GPU memory changes without telling anyone). Supervisors come from a spawner process
(zygote.py), so the daemon itself never forks. Jobs run under their own supervisors, so stopping
or killing the daemon leaves them running; a new daemon picks up where it left off. On start it
marks `lost` the jobs that were running before a reboot.

While CPU-only jobs fill their slots, the job that starts next is already handed to a spare
supervisor, which prepares it; when a CPU-only job ends and nothing else changed, its end and
the next start are committed in one transaction and the spare is told to go, without a pass.
With one CPU slot and a stream of short jobs it goes further: the next start is committed while
the job before runs, and that job's own supervisor is handed it, to start it the moment the
job before ends, with no word with the daemon in between (_Handed).
A supervisor whose job's end is recorded is kept for another job while jobs wait, unless its
job was stopped or anyone asked to stop it (a stop signal may still be on its way to it).
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import math
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress

from gpubox import __version__
from gpubox.exit_codes import ExitCode
from gpubox.paths import Paths, ensure_private_dir
from gpubox.queue import proctree, supervise
from gpubox.queue.gpus import GpuInfo, NoNvml, NvmlGpus, jobs_memory
from gpubox.queue.jobs import END_STATES, Job
from gpubox.queue.layout import (
    LOCK_NAME,
    attempt_prefix,
    db_path,
    log_paths,
    logs_dir,
    socket_path,
    socket_problem,
)
from gpubox.queue.schedule import Plan, QueueConfig, gpu_count_of, plan_pass
from gpubox.queue.spares import SparePool
from gpubox.queue.spawner import EarlyStart, Spawner
from gpubox.queue.store import QUEUE, JobStore, file_identity
from gpubox.telemetry.devices import nvidia_devices_present

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

START_GRACE_S = 30.0  # a job recorded as started without a supervisor pid for this long never ran
LOCK_WAIT_S = 10.0  # how long a new daemon waits out clients that hold its lock shared
REPEAT_LOG_S = 600.0  # how often the daemon says again that the same thing still fails
# With nothing for a timed pass to find, the daemon wakes only to see commits made without a
# poke (every client pokes it; an sqlite3 shell does not) and a state folder removed under it:
# this many poll intervals apart. Where a process's work costs more the longer it slept, it
# costs less than in proportion (benchmarks/wake_cost.py): fewer wakes are what idle can save.
IDLE_POLLS = 5


class AlreadyRunning(Exception):
    """Another daemon holds this state directory."""


class CannotListen(Exception):
    """The daemon's socket cannot be made (its path too long, a folder in the way)."""


@dataclasses.dataclass(frozen=True)
class _Guess:
    """The CPU-only jobs that start next, one each time a CPU-only job ends, planned while the
    running ones run.

    CPU-only jobs have their own slots and their own line (policy.py): which one starts when a
    slot frees depends only on the queued jobs, their dependencies and the pause, not on the
    GPUs, the time or which CPU-only job ended. The guess holds while the database is as it was
    read (`version`: other connections' commits unchanged; `writes`: this daemon's), but for
    the ends and starts it was made for, and while no queued job runs after the job that ends
    (`not_after`).
    """

    jobs: tuple[Job, ...]  # in the order they start
    version: int
    writes: int
    not_after: frozenset[int]

    @property
    def job(self) -> Job:
        return self.jobs[0]


@dataclasses.dataclass(frozen=True)
class _Armed:
    """A spare that has the guessed job's launch and waits for "go"."""

    guess: _Guess
    spare: supervise.Spare
    log_prefix: str  # the launch's, kept for the start it is recorded with (Path joins on the way cost)


@dataclasses.dataclass
class _Handed:
    """A CPU-only job whose start is committed under the supervisor of the CPU-only job that
    runs, handed to it to run the moment that job ends (with the one slot, nothing else could
    start then): no word with this daemon between the two. Taken back when the job running does
    not end within HAND_ON_S, or when another connection commits (the line may change)."""

    guess: _Guess  # its job first, as the database was after the start was committed
    supervisor: supervise.Spare
    after: tuple[int, int]  # the attempt it runs after
    at: float  # when it was handed on (monotonic)
    revoking: bool = False

    @property
    def job(self) -> Job:
        return self.guess.job

    @property
    def attempt(self) -> tuple[int, int]:
        """The job handed on and the attempt its start is recorded as."""
        return self.guess.job.id, self.guess.job.attempt + 1


def boot_id(env: dict[str, str] | None = None) -> str:
    """This boot's id: jobs recorded under another one ran before a restart."""
    env = dict(os.environ) if env is None else env
    if env.get("GPUBOX_BOOT_ID"):
        return env["GPUBOX_BOOT_ID"]
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


class Daemon:
    def __init__(
        self,
        paths: Paths,
        config: QueueConfig,
        gpu_source: Any = None,
        boot: str | None = None,
        clock: Callable[[], float] = time.time,
        log: Callable[[str], None] | None = None,
        recording: Callable[[Daemon], Any] | None = None,
        early: EarlyStart | None = None,
    ) -> None:
        """`recording(daemon)`: the ledger's sampler (start(), stop()), which runs beside the queue in
        a thread and reads `daemon.running`, `daemon.waiting` and `daemon.log`. `early`: the
        supervisor spawner, started before this module was imported; `run` takes it over."""
        self.paths = paths
        self._early = early
        self.recording = recording
        # For the ledger: the running jobs after the last pass (None before the first pass, when they
        # are unknown and the ledger records nothing) and why each queued job waits.
        self.running: tuple[Job, ...] | None = None
        self.waiting: dict[int, str] = {}
        self._sampler: Any = None
        self.config = config
        self.gpus_source = gpu_source if gpu_source is not None else NvmlGpus()
        self.boot = boot or boot_id()
        self.clock = clock
        self.log = log or _say
        self.db_path = db_path(paths)
        self.socket_path = socket_path(paths)
        self.logs_dir = logs_dir(paths)
        self.pool: SparePool | None = None  # supervisors forked ahead, made when the loop starts
        # (job id, attempt): the supervisor running it, which waits for "recorded" at its end
        self._supervising: dict[tuple[int, int], supervise.Spare] = {}
        # Those of them that run without GPUs: their ends may take the fast way (without a read).
        # (When each started, on the wall clock: a stream of short jobs is told by how long they ran.)
        self._cpu_attempts: dict[tuple[int, int], float] = {}
        self._stream = False  # the last CPU-only job this daemon recorded ran less than STREAM_S
        self._done_w = -1
        self.reasons: dict[int, str] = {}
        self.last_gpus: list[GpuInfo] = []
        self._nvml_error: str | None = None
        self.started_at = clock()
        self.started_mono = time.monotonic()
        self._stop = False
        # Why it stopped on its own (its state folder removed): it then exits 1, so that a
        # service manager that restarts it on failure brings up a daemon for the new folder.
        self._gone: str | None = None
        self._dirty = True
        # When every queued job was last read, and until when NVML is not asked again: on the
        # monotonic clock, as intervals. On the wall clock, one set back an hour stopped the timed
        # passes for an hour (a killed supervisor unnoticed, jobs waiting on GPU memory held).
        self._last_full = -math.inf
        self._active = True  # whether a timed pass may find what no commit shows (see _pass)
        self._busy = True  # jobs were queued or running at the last pass
        self._cpu_config = dataclasses.replace(config, preempt=False, max_cpu_jobs=1 << 30)
        self._guess: _Guess | None = None
        self._armed: _Armed | None = None
        self._handed: _Handed | None = None
        self._not_kept: set[int] = set()  # supervisors (pids) not to keep once their job handed on ends
        self._start_times: list[tuple[int, int, float]] = []  # said by "on", not yet recorded
        # The CPU-only job this daemon started last (as it was read before its start), and the
        # attempt that kept its handed-on job too long (nothing more is handed on to it).
        self._fast_job: Job | None = None
        self._held_up: tuple[int, int] | None = None
        self._refresh_at: float | None = None  # when to plan again after fast starts (monotonic)
        self._no_gpus_until = -math.inf
        self._planned = False  # a pass has planned (and so knows whether jobs wait)
        # The database's version (data_version) when a pass last read every queued job and found
        # them all CPU-only: true for as long as no other connection commits (see _pass).
        self._cpu_only_at: int | None = None
        self._reboot_checked = False  # the jobs that ran before a restart of the machine are marked lost
        self._lock_file: tuple[int, int] | None = None  # the lock file it holds (device, inode)
        self._lock_path = paths.state_dir / LOCK_NAME
        self._state_check_at = -math.inf  # when to look again whether the state folder was replaced

    # Set-up

    def _lock(self) -> int:
        ensure_private_dir(self.paths.state_dir)
        fd = os.open(self.paths.state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        # A client that checks for a daemon holds the lock shared for a moment: when the pid in
        # the file is not a live process, that is what holds it; try again. Not for a fixed count
        # of tries: on a box loaded enough to hold such a client up, they all failed in a second,
        # and the daemon a client had started exited, leaving the jobs waiting.
        holder = ""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                if holder.isdigit() and int(holder) != os.getpid() and proctree.is_alive(int(holder), None):
                    break  # a daemon holds it
                holder = ""
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            where = self.paths.state_dir
            raise AlreadyRunning(f"a gpubox daemon (pid {holder or '?'}) already runs for {where}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _listen(self) -> socket.socket:
        ensure_private_dir(self.paths.runtime_dir)
        problem = socket_problem(self.paths)
        if problem is not None:
            raise CannotListen(problem)
        with suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # stale: we hold the lock, so no daemon listens on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.socket_path))
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        return sock

    def run(self) -> int:
        # What is taken before the loop is given back in reverse order however far it got: a
        # database that fails to open, or no descriptor left for a pipe, leaves no lock held, no
        # checkpoint thread and no open file behind (in a process that runs a daemon and goes on).
        with ExitStack() as held:
            lock_fd = self._lock()
            held.callback(os.close, lock_fd)
            held.callback(self.gpus_source.close)
            store = JobStore(self.db_path, clock=self.clock, durable=False)
            held.callback(store.close)
            try:
                store.checkpoint_aside()
            except RuntimeError as exc:  # no thread to be had (the jobs took the process limit): run on
                self.log(f"WAL checkpoints stay in the daemon's commits: {exc}")
            lock_stat = os.fstat(lock_fd)
            self._lock_file = (lock_stat.st_dev, lock_stat.st_ino)
            wake_r, wake_w = _pipe(held)
            # Supervisors write "<job> <attempt>" here once the exit record is on disk.
            spawner: Spawner | None = None
            if self._early is not None:
                done_r, self._done_w, spawner = self._early.hand_over()
                held.callback(os.close, done_r)
                held.callback(os.close, self._done_w)
                held.callback(spawner.close)  # (closed before the pipe it was given)
            else:
                done_r, self._done_w = _pipe(held)
            sel = held.enter_context(selectors.DefaultSelector())
            self._run_loop(store, sel, wake_r, wake_w, done_r, spawner)
        self.log("stopped; running jobs go on under their supervisors")
        return 0 if self._gone is None else int(ExitCode.FAILED)

    def _run_loop(
        self,
        store: JobStore,
        sel: selectors.BaseSelector,
        wake_r: int,
        wake_w: int,
        done_r: int,
        spawner: Spawner | None = None,
    ) -> None:
        """Listen and run the loop; on the way out, send the supervisors off and stop listening."""
        listening: tuple[int, int] | None = None
        listener: socket.socket | None = None
        old_handlers: dict[signal.Signals, Any] = {}
        self.pool = SparePool(self._done_w, sel, SPARES, spawner)
        try:
            # The spawner (a Python of its own) starts while this one gets ready, if it was not
            # started before (EarlyStart): the first job of a cold queue waits for both. A daemon
            # is mostly started for jobs just added.
            failure = self._early.failure if self._early is not None else None
            try:
                if failure is None:
                    self.pool.warm()
            except OSError as exc:  # a process limit, say: a start asks again
                failure = exc
            if failure is not None:
                self.log(f"could not start the supervisor spawner: {failure}; trying again when a job starts")
            if store.any_queued():
                # One spare for the first job, and one to prepare the next while it runs: asked
                # for after the first start, it came once that job had ended (a cold queue's
                # second job waited 5 to 7 ms for a start without one).
                self._keep_spare(True, ahead=1)
            listener = self._listen()
            listening = file_identity(self.socket_path)
            ensure_private_dir(self.logs_dir)
            signal.set_wakeup_fd(wake_w)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
            self.log(f"pid {os.getpid()}, state {self.paths.state_dir}, socket {self.socket_path}")
            self._loop(store, sel, listener, wake_r, done_r)
        finally:
            if self._sampler is not None:
                self._sampler.stop()  # writes the GPU use not written yet
            self._disarm()
            if self._handed is not None:
                supervise.discard(self._handed.supervisor)
                self._handed = None
            for spare in self._supervising.values():
                supervise.discard(spare)  # each leaves its job's exit record for the next daemon
            self._supervising.clear()
            self._cpu_attempts.clear()
            self.pool.close()
            signal.set_wakeup_fd(-1)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            if listener is not None:
                listener.close()
                # Only our own: a daemon whose state folder was removed leaves the socket that a
                # daemon for the new one may have bound since.
                with suppress(OSError):
                    if listening is not None and file_identity(self.socket_path) == listening:
                        os.unlink(self.socket_path)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._stop = True

    # The loop

    def _loop(
        self, store: JobStore, sel: selectors.BaseSelector, listener: socket.socket, wake_r: int, done_r: int
    ) -> None:
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(wake_r, selectors.EVENT_READ, "signal")
        sel.register(done_r, selectors.EVENT_READ, "done")
        version = store.data_version()
        pending = b""
        failures = 0
        said: tuple[str, float] | None = None  # the failure logged last, and when
        while not self._stop:
            try:
                if not self._reboot_checked:
                    # In the loop, tried again like a pass: a database held locked for a while (a
                    # backup, an sqlite3 shell) must not end a daemon that is only starting.
                    # Before any pass, which would take those jobs for ones whose supervisor died.
                    lost = store.lost_after_reboot(self.boot)
                    self._reboot_checked = True
                    if lost:
                        self.log(f"marked lost after a restart of the machine: jobs {', '.join(map(str, lost))}")
                events = sel.select(timeout=self._timeout())
                gone = self._state_replaced(store) if time.monotonic() >= self._state_check_at else None
                if gone is not None:
                    self.log(f"{gone}; stopping")
                    self._gone = gone
                    break
                for key, _ in events:
                    if key.data == "listen":
                        self._accept(listener, store)
                    elif key.data == "spawner" and self.pool is not None:
                        # Before the first pass, a spare was asked for only because jobs were
                        # queued: kept for the first of them (sent away, a cold queue's first
                        # job waited for the pass and then for another spare's fork).
                        self.pool.on_readable(wanted=bool(self.reasons) or not self._planned)
                        self._arm(store)
                    elif key.data == "done":
                        pending += _drain(done_r)
                        *lines, pending = pending.split(b"\n")
                        for line in lines:
                            try:
                                chained = supervise.parse_chain(line)
                                if chained is None:
                                    self._record_done(store, line)
                                elif chained[2] is not None:
                                    self._on(store, chained[0], chained[1], chained[2])
                                else:
                                    self._back(store, chained[0], chained[1])
                            except Exception as exc:
                                # Its supervisor leaves an exit record for a later pass; the others
                                # read with it are still recorded (each waits for its "recorded").
                                self.log(f"{type(exc).__name__}: {exc}; its job is recorded from its exit record")
                                self._dirty = True
                        self._record_start(store)
                        self._arm(store)
                    else:
                        _drain(wake_r)
                if self._stop:
                    break
                current = store.data_version()
                if current != version:
                    version, self._dirty = current, True
                # Another connection committed since the job handed on was chosen (an add ahead, a
                # cancel; also one a pass took in): the line may have changed.
                self._revoke(force=self._handed is not None and current != self._handed.guess.version)
                if self._refresh_at is not None and time.monotonic() >= self._refresh_at:
                    self._dirty = True
                due = time.monotonic() - self._last_full >= self.config.poll_interval_s
                if self._dirty or (due and self._active):
                    self._dirty = False
                    self._refresh_at = None
                    self._pass(store, full=due)
                    if due:
                        self._last_full = time.monotonic()
                    version = store.data_version()
                if self.recording is not None and self._planned and (self._record_at() <= 0 or not self._busy):
                    self._start_recording(store, self.recording)
                if failures and said is not None:
                    self.log("working again")
                failures, said = 0, None
            except Exception as exc:  # the daemon outlives a bad moment, not a bad job
                # A locked or failing database, a spawner that died: say so, wait, look again.
                failures += 1
                what = f"{type(exc).__name__}: {exc}; trying again"
                # The same failure again (a damaged database fails every pass): said once, then
                # every REPEAT_LOG_S, not every few seconds into the log for days.
                if said is None or said[0] != what or time.monotonic() - said[1] >= REPEAT_LOG_S:
                    self.log(what if said is None or said[0] != what else f"still failing: {what}")
                    said = (what, time.monotonic())
                self._dirty = True
                time.sleep(min(0.1 * 2 ** min(failures, 10), self.config.poll_interval_s))  # 2**1024 overflows

    def _state_replaced(self, store: JobStore) -> str | None:
        """Why this daemon's state is no longer the state folder's (removed, or replaced: a reset
        to start afresh), or None. Another daemon may serve the new one; this one would go on
        running the old queue's jobs where nobody can see or cancel them. Looked at on a wake-up
        at most every STATE_CHECK_S: in a stream of short jobs, once a job was 15 us (two stats)
        of the way from one job to the next."""
        self._state_check_at = time.monotonic() + STATE_CHECK_S
        try:
            lock_moved = file_identity(self._lock_path) != self._lock_file
        except OSError:  # a folder made unreadable, say: not known to be another queue's
            return None
        if not lock_moved and not store.replaced():
            return None
        return f"the state folder {self.paths.state_dir} was removed or replaced under this daemon"

    def _timeout(self) -> float:
        if self._dirty:
            return 0
        longest = self.config.poll_interval_s * (1 if self._active else IDLE_POLLS)
        if self.recording is not None and self._planned:  # the ledger's sampler is due then
            longest = min(longest, self._record_at())
        if self._handed is not None and not self._handed.revoking:
            longest = max(0.0, min(longest, self._handed.at + HAND_ON_S - time.monotonic()))
        if self._refresh_at is not None:
            return max(0.0, min(longest, self._refresh_at - time.monotonic()))
        return longest

    def _record_at(self) -> float:
        """Seconds until the ledger's sampler starts even while jobs run (0: now)."""
        return max(0.0, self.started_mono + RECORDING_AFTER_S - time.monotonic())

    def _accept(self, listener: socket.socket, store: JobStore) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            with conn:
                conn.settimeout(1.0)
                try:
                    self._serve(conn, store)
                except (OSError, ValueError) as exc:
                    self.log(f"a client request failed: {exc}")

    def _serve(self, conn: socket.socket, store: JobStore) -> None:
        data = b""
        while not data.endswith(b"\n") and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        request = json.loads(data or b"{}")
        op = request.get("op") if isinstance(request, dict) else None
        answer: dict[str, Any]
        if op == "wake":
            self._dirty = True
            return
        if op == "status":
            answer = self.status(store)
        elif op == "view":
            answer = {
                "reasons": {str(k): v for k, v in self.reasons.items()},
                "gpus": [{"index": g.index, "uuid": g.uuid} for g in self.last_gpus],
            }
        elif op == "stop":
            self._stop = True
            answer = {"stopping": True, "pid": os.getpid()}
        else:
            answer = {"error": f"unknown request {op!r}"}
        conn.sendall(json.dumps(answer).encode() + b"\n")

    def status(self, store: JobStore) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for job in store.list(["queued", "running"]):
            counts[job.state] = counts.get(job.state, 0) + 1
        return {
            "pid": os.getpid(),
            "version": __version__,
            "started_at": self.started_at,
            "boot_id": self.boot,
            "state_dir": str(self.paths.state_dir),
            "socket": str(self.socket_path),
            "queued_jobs": counts.get("queued", 0),
            "running_jobs": counts.get("running", 0),
            "paused": sorted(store.paused()),
            "paused_labels": self._paused_labels(store),
        }

    def _paused_labels(self, store: JobStore) -> list[str]:
        """What is paused, as people name it: "the queue", "GPU 1" (a GPU gone from the box by
        its UUID)."""
        index = {g.uuid: g.index for g in self.last_gpus}
        paused = store.paused()
        labels = ["the queue"] if QUEUE in paused else []
        gpus = sorted((index.get(t, 1 << 30), t) for t in paused if t != QUEUE)
        return labels + [f"GPU {t}" if i == 1 << 30 else f"GPU {i}" for i, t in gpus]

    # One pass

    def _gpus(self) -> list[GpuInfo] | None:
        """The GPUs now; [] on a box without NVIDIA GPUs; None when it has some that NVML cannot
        read now (a driver still loading, an upgrade): GPU jobs then wait instead of starting
        without a GPU."""
        if time.monotonic() < self._no_gpus_until:
            return None if self._nvml_error else []
        try:
            self.last_gpus = list(self.gpus_source.read())
            self._nvml_error = None
            return self.last_gpus
        except NoNvml as exc:
            self._no_gpus_until = time.monotonic() + 10.0  # do not try on every pass
            self._nvml_error = str(exc) if nvidia_devices_present() else None
            return None if self._nvml_error else []

    def _job_memory(self, running: list[Job]) -> dict[str, tuple[tuple[int, int], ...] | None]:
        """Per GPU, what each running job's processes (its supervisor's tree) use there: what
        stopping that job would free. Read from NVML and /proc, so only when a preemption is
        weighed; empty when NVML cannot list processes (then not known)."""
        read = getattr(self.gpus_source, "processes", None)  # a source without it: not known
        if read is None:
            return {}
        try:
            processes = read()
        except NoNvml:
            return {}
        owner = proctree.owners({j.pid: j.id for j in running if j.pid is not None and j.gpu_uuids})
        return {uuid: jobs_memory(listed, owner) for uuid, listed in processes.items()}

    def _reconcile(self, store: JobStore, running: list[Job]) -> bool:
        """End the attempts whose supervisor vanished without recording them; True if any."""
        changed = False
        now = self.clock()
        handed = self._handed
        if handed is not None and handed.attempt not in {(j.id, j.attempt) for j in running}:
            self._handed = None  # its start was undone, or it ended, with no word here
        for job in running:
            if job.pid is None:
                if now - (job.started_at or now) < START_GRACE_S:
                    continue
                outcome = supervise.Outcome(None, "lost", "the daemon stopped while starting it")
            elif proctree.is_alive(job.pid, job.pid_start):
                # A supervisor this daemon does not talk to (it ran before a restart) may have gone
                # on to a job handed on: the end it left in an exit record is recorded now, not once
                # that job ends too. One this daemon talks to says it on the done pipe.
                handed = self._handed
                if (job.id, job.attempt) in self._supervising or (
                    handed is not None and handed.attempt == (job.id, job.attempt)
                ):
                    continue
                found = self._exit_record(job)
                if found is None:
                    continue
                if not found.ran and job.request is None:
                    self._abandon(store, job.id, job.attempt)
                    changed = True
                    continue
                outcome = found
            else:
                if self._handed is not None and self._handed.supervisor.pid == job.pid:
                    self._handed = None  # its supervisor died: the job handed on ends with it, below
                supervise.discard(self._supervising.pop((job.id, job.attempt), supervise.GONE))
                self._not_kept.discard(job.pid)
                self._cpu_attempts.pop((job.id, job.attempt), None)
                found = self._exit_record(job)
                if found is not None and not found.ran and job.request is None:
                    changed = self._abandon(store, job.id, job.attempt) or changed
                    continue
                outcome = found or self._orphaned(job)
            changed = self._finish(store, job, outcome) or changed
        return changed

    def _abandon(self, store: JobStore, job_id: int, attempt: int, say: bool = True) -> bool:
        """A start whose job never ran, by nobody's request (as _record_outcome sees it when
        told; its supervisor gone before "go"): it runs later (store.abandon_start). The exit
        record that may say so goes after: that attempt number is used again."""
        queued = store.abandon_start(job_id, attempt)
        if queued and say:
            self.log(f"job {job_id}: its supervisor was stopped before the job ran; queued again")
        with suppress(OSError):
            os.unlink(log_paths(attempt_prefix(self.logs_dir, job_id, attempt))[2])
        return queued

    def _record_done(self, store: JobStore, line: bytes) -> None:
        """A supervisor says how its attempt ended: record it now, then tell it so (it leaves an
        exit record only when nobody does)."""
        done = supervise.parse_done(line)
        if done is None:
            return
        job_id, attempt, outcome = done
        spare = self._supervising.pop((job_id, attempt), supervise.GONE)
        since = self._cpu_attempts.pop((job_id, attempt), None)
        cpu_only = since is not None
        if since is not None:
            ran = (outcome.ended_at or self.clock()) - since
            self._stream = outcome.ran and ran < STREAM_S
        try:
            # A CPU-only job that ran and ended of itself, while the next start is armed: its end
            # and that start in one transaction, which reads what it needs (the job's state and
            # attempt are checked there), before anything else. Otherwise the job is read first.
            fast = cpu_only and outcome.ran and outcome.outcome in ("succeeded", "failed")
            if not fast:
                self._record_start(store)  # before the end: a start time said first is written first
            if fast and (
                self._finish_and_start_next(store, job_id, attempt, outcome, spare)
                or self._finish_and_hand_on(store, job_id, attempt, outcome, spare)
                or self._finish_before_on(store, job_id, attempt, outcome, spare)
            ):
                return
            self._record_start(store)
            self._record_outcome(store, job_id, attempt, outcome, spare, try_fast=not fast)
        except BaseException:
            supervise.discard(spare)  # not recorded: it leaves its exit record, read by a later pass
            raise

    def _record_outcome(
        self,
        store: JobStore,
        job_id: int,
        attempt: int,
        outcome: supervise.Outcome,
        spare: supervise.Spare,
        try_fast: bool = True,
    ) -> None:
        job = store.get(job_id)
        if job is None or job.state != "running" or job.attempt != attempt:
            self._release(spare, reuse=False)  # nothing to record: ended already
            return
        if not outcome.ran and job.request is None:
            # Its supervisor was stopped before the job ran, by nobody's request: run it later.
            if self._abandon(store, job.id, job.attempt):
                self._dirty = True
            self._release(spare, reuse=False)
            return
        if outcome.outcome == "cancelled" and job.request == "cancel":
            outcome = dataclasses.replace(outcome, reason="cancelled on request")
        fast = try_fast and not job.gpu_uuids
        if not (fast and self._finish_and_start_next(store, job.id, job.attempt, outcome, spare)):
            with store.transaction():
                asked = self._stop_asked(store, job.id)
                ended = store.finish(
                    job.id, job.attempt, outcome.exit_code, outcome.outcome, outcome.reason, ended_at=outcome.ended_at
                )
            if ended is not None:
                self._ended(job.id, outcome)
            self._release(spare, reuse=ended is not None and _keeps(outcome, asked))

    @staticmethod
    def _stop_asked(store: JobStore, job_id: int) -> bool:
        """Whether anyone asked to stop the job, read in the transaction that ends it: a cancel or
        preemption commits its request before it signals the supervisor, so a signal still on
        its way has its request read here (or comes after the end, to a job that ended)."""
        return store.stop_request(job_id) is not None

    def _release(self, spare: supervise.Spare, reuse: bool) -> None:
        """Tell a supervisor its job's end is recorded; keep it for another job when `reuse`."""
        if not supervise.recorded(spare):
            self._not_kept.discard(spare.pid)
            return  # gone, or sent away already
        if self._runs_another(spare):
            # It went on to the job handed on: it stays that job's supervisor, and is not kept
            # after it when it should not have been after this one.
            if not reuse:
                self._not_kept.add(spare.pid)
            return
        if reuse and self.pool is not None and spare.pid not in self._not_kept:
            self.pool.give_back(spare)
        else:
            self._not_kept.discard(spare.pid)
            supervise.discard(spare)

    def _finish(self, store: JobStore, job: Job, outcome: supervise.Outcome) -> bool:
        ended = store.finish(
            job.id, job.attempt, outcome.exit_code, outcome.outcome, outcome.reason, ended_at=outcome.ended_at
        )
        if ended is None:
            return False
        self._ended(job.id, outcome)
        return True

    def _ended(self, job_id: int, outcome: supervise.Outcome) -> None:
        self._dirty = True
        self._say_end(job_id, outcome)

    def _say_end(self, job_id: int, outcome: supervise.Outcome) -> None:
        """In the log, an end other than success."""
        if outcome.outcome != "succeeded":
            self.log(f"job {job_id}: {outcome.outcome}" + (f" ({outcome.reason})" if outcome.reason else ""))

    def _finish_and_start_next(
        self, store: JobStore, job_id: int, attempt: int, outcome: supervise.Outcome, supervisor: supervise.Spare
    ) -> bool:
        """The fast way from a CPU-only job (the caller knows it is one) to the next: record its
        end and the start of the job armed for it in one transaction, then say go. False (nothing
        done) when the guess no longer holds; the pass decides then. `supervisor`: the one whose
        job ended."""
        armed = self._armed
        if armed is None or job_id in armed.guess.not_after or store.writes != armed.guess.writes:
            return False
        guess, spare, prefix = armed.guess, armed.spare, armed.log_prefix
        nxt = guess.job
        started = False
        with store.transaction():
            if store.data_version() != guess.version:
                return False  # someone changed the queue since the guess
            self._write_start_times(store)
            # The stop asked of it comes from the same read as the end (see _stop_asked).
            ended = _end_attempt(store, job_id, attempt, outcome)
            asked = ended is not None and ended[1] is not None
            if ended is not None and ended[0] in END_STATES:  # not back in the queue
                # No `expect`: nobody else committed since the job was read, so its spec is the one read.
                started = store.mark_started(nxt.id, spare.pid, (), self.boot, prefix, pid_start=spare.pid_start)
        reuse = ended is not None and _keeps(outcome, asked)
        if not started:
            if ended is not None:
                self._ended(job_id, outcome)  # the pass decides what starts
            self._release(supervisor, reuse)
            return True
        # Nothing that can raise (a log line to a closed stderr) between the committed start and
        # "go": a start without its go would end the job `lost` without running it.
        self._armed = None
        went = self._go(store, nxt, spare, cpu_only=True)
        self._release(supervisor, reuse)  # before arming: it may prepare the job after
        self._say_end(job_id, outcome)
        if not went:  # back in the queue, ahead of the rest of the guess: the pass decides
            self._guess = None
            return True
        rest = guess.jobs[1:]
        # What this transaction changed (one CPU-only job ended, the first guessed started) leaves
        # the rest of the line as it was: the guess goes on.
        self._guess = dataclasses.replace(guess, jobs=rest, writes=store.writes) if rest else None
        self._arm(store)
        if len(rest) <= 1:
            self._dirty = True  # read the queue again while this job runs
        elif self._refresh_at is None:
            # A pass brings the reasons jobs wait for (and the ledger's view) up to date; in a
            # stream of short jobs, one a while, not one a job.
            self._refresh_at = time.monotonic() + REFRESH_S
        return True

    def _go(self, store: JobStore, job: Job, spare: supervise.Spare, cpu_only: bool) -> bool:
        """Let a spare run the job it prepared, whose start is committed; False when the spare
        is gone (the start is undone)."""
        try:
            supervise.go(spare)
        except OSError:
            self._abandon(store, job.id, job.attempt + 1, say=False)  # it never ran: as if not started
            self._dirty = True
            return False
        self._supervising[job.id, job.attempt + 1] = spare
        if cpu_only:
            self._cpu_attempts[job.id, job.attempt + 1] = self.clock()
            self._fast_job = job
        self.reasons.pop(job.id, None)
        return True

    # Jobs handed on: see _Handed

    def _runs_another(self, supervisor: supervise.Spare) -> bool:
        """Whether a supervisor has another job than the one whose end was just recorded: one it
        runs, or one handed to it."""
        if self._handed is not None and self._handed.supervisor is supervisor:
            return True
        return any(other is supervisor for other in self._supervising.values())

    def _hand_on_target(self, guess: _Guess) -> tuple[supervise.Spare, tuple[int, int]] | None:
        """The supervisor to hand the guessed job to, and the attempt it runs: the one CPU-only job
        running, with the one slot, in a stream of short ones (the one before ran less than
        STREAM_S: a job handed on behind a long one is only taken back), started by this daemon
        (its spec is known: no retries, which would put it back in the line ahead), and no
        queued job waiting for its end."""
        running = self._fast_job
        if self.config.max_cpu_jobs != 1 or len(self._cpu_attempts) != 1 or running is None or not self._stream:
            return None
        key = next(iter(self._cpu_attempts))
        supervisor = self._supervising.get(key)
        if supervisor is None or key != (running.id, running.attempt + 1) or key == self._held_up:
            return None
        if supervisor.pid in self._not_kept:
            return None  # its last job was asked to stop: another signal may be on its way
        if running.spec.retries or running.id in guess.not_after:
            return None
        return supervisor, key

    def _hand_on(self, store: JobStore, guess: _Guess) -> bool:
        """Hand the guessed job to the supervisor of the CPU-only job running (_Handed), its start
        committed first; False when that cannot be (then a spare is armed instead)."""
        target = self._hand_on_target(guess)
        if target is None or store.writes != guess.writes:
            return False
        supervisor, after = target
        nxt = guess.job
        launch = self._launch(nxt, ())
        with store.transaction():
            if store.data_version() != guess.version:
                return False
            self._write_start_times(store)
            started = store.mark_started(
                nxt.id, supervisor.pid, (), self.boot, str(launch.log_prefix), pid_start=supervisor.pid_start
            )
        if not started:
            self._guess = None
            self._dirty = True
            return True
        self._handed_to(store, guess, supervisor, after, launch, recorded=False)
        return True

    def _handed_to(
        self,
        store: JobStore,
        guess: _Guess,
        supervisor: supervise.Spare,
        after: tuple[int, int],
        launch: supervise.Launch,
        recorded: bool,
    ) -> None:
        """Send the job whose start was just committed to its supervisor."""
        self._guess = None
        nxt = guess.job
        try:
            supervise.hand_on(supervisor, launch, recorded)
        except OSError:
            self._abandon(store, nxt.id, nxt.attempt + 1, say=False)  # it never ran: as if not started
            self._dirty = True
            return
        self._handed = _Handed(dataclasses.replace(guess, writes=store.writes), supervisor, after, time.monotonic())
        self.reasons.pop(nxt.id, None)

    def _finish_and_hand_on(
        self, store: JobStore, job_id: int, attempt: int, outcome: supervise.Outcome, supervisor: supervise.Spare
    ) -> bool:
        """The fast way when the supervisor whose job ended runs the job handed on to it: record
        the end and hand it the job after in one transaction, and say both in one write."""
        guess = self._guess
        if guess is None or self._handed is not None or self._armed is not None or job_id in guess.not_after:
            return False
        target = self._hand_on_target(guess)
        if target is None or target[0] is not supervisor or store.writes != guess.writes:
            return False
        nxt = guess.job
        launch = self._launch(nxt, ())
        started = False
        with store.transaction():
            if store.data_version() != guess.version:
                return False
            self._write_start_times(store)
            ended = _end_attempt(store, job_id, attempt, outcome)
            if ended is not None and ended[0] in END_STATES and ended[1] is None:
                started = store.mark_started(
                    nxt.id, supervisor.pid, (), self.boot, str(launch.log_prefix), pid_start=supervisor.pid_start
                )
        if not started:
            if ended is not None:
                self._ended(job_id, outcome)
            # It runs the job handed on before: it stays, and is kept after it only if it could be now.
            self._release(supervisor, reuse=ended is not None and _keeps(outcome, ended[1] is not None))
            return True
        self._handed_to(store, guess, supervisor, target[1], launch, recorded=True)
        self._say_end(job_id, outcome)
        return True

    def _finish_before_on(
        self, store: JobStore, job_id: int, attempt: int, outcome: supervise.Outcome, supervisor: supervise.Spare
    ) -> bool:
        """The fast way for the end of a job whose supervisor went on to a job handed on (it
        started, or starts now and says "on" next), when the end and the next start cannot go
        in one transaction: the end alone, without a read. The guess behind holds."""
        handed = self._handed
        pending = handed is not None and handed.supervisor is supervisor
        if not (pending or self._runs_another(supervisor)) or (handed is not None and handed.revoking):
            return False
        guess = handed.guess if pending and handed is not None else self._guess
        if guess is not None and (job_id in guess.not_after or store.writes != guess.writes):
            return False
        with store.transaction():
            if guess is not None and store.data_version() != guess.version:
                return False
            self._write_start_times(store)
            ended = _end_attempt(store, job_id, attempt, outcome)
        if ended is None or ended[0] not in END_STATES or guess is None:
            if ended is not None:
                self._ended(job_id, outcome)  # back in the queue, or the line is read again: a pass decides
        else:
            moved = dataclasses.replace(guess, writes=store.writes)
            if pending and handed is not None:
                handed.guess = moved
            else:
                self._guess = moved
            self._say_end(job_id, outcome)
        # It stays (it runs the job handed on), and is kept after it only if it could be now.
        self._release(supervisor, reuse=ended is not None and _keeps(outcome, ended[1] is not None))
        return True

    def _on(self, store: JobStore, job_id: int, attempt: int, started_at: float) -> None:
        """A job handed on started: its supervisor is now that job's, and its start is when it
        says (recorded with the next transaction: the end of the job before, most often)."""
        handed = self._handed
        if handed is None or handed.attempt != (job_id, attempt):
            return
        self._handed = None
        self._start_times.append((job_id, attempt, started_at))
        self._supervising[job_id, attempt] = handed.supervisor
        self._cpu_attempts[job_id, attempt] = started_at
        self._fast_job = handed.job
        rest = handed.guess.jobs[1:]
        if self._guess is None and rest:
            self._guess = dataclasses.replace(handed.guess, jobs=rest)
        if len(rest) <= 1:
            self._dirty = True  # read the queue again while this job runs
        elif self._refresh_at is None:
            self._refresh_at = time.monotonic() + REFRESH_S

    def _write_start_times(self, store: JobStore) -> None:
        """The start times said with "on", in the transaction open (they change no job's state)."""
        times, self._start_times = self._start_times, []
        for job_id, attempt, started_at in times:
            store.started_at(job_id, attempt, started_at)

    def _record_start(self, store: JobStore) -> None:
        """The start times that no transaction took with it, in one of their own; the guess holds."""
        if not self._start_times:
            return
        guess = self._guess
        in_step = guess is not None and guess.writes == store.writes
        with store.transaction():
            self._write_start_times(store)
        if guess is not None and in_step:
            self._guess = dataclasses.replace(guess, writes=store.writes)

    def _back(self, store: JobStore, job_id: int, attempt: int) -> None:
        """A job handed on was dropped before it ran (taken back, or its supervisor stopped): it
        goes back to the queue, or ends cancelled if that was asked."""
        handed = self._handed
        supervisor = None
        if handed is not None and handed.attempt == (job_id, attempt):
            self._handed = None
            self._held_up = handed.after  # nothing more is handed on behind that job
            supervisor = handed.supervisor
        self._dirty = True
        if supervisor is None:
            return  # not the job handed on now (a line from before): its exit record says the same
        idle = not self._runs_another(supervisor)  # its own end is recorded
        try:
            job = store.get(job_id)
            if job is not None and job.state == "running" and job.attempt == attempt:
                if job.request is None:
                    self._abandon(store, job.id, job.attempt)  # (its exit record says "not run" until then)
                else:
                    dropped = supervise.Outcome(None, "cancelled", "cancelled on request before it ran", ran=False)
                    self._finish(store, job, dropped)
        except BaseException:
            if idle:
                supervise.discard(supervisor)  # it exits: a later pass reads the job's exit record
            raise
        if idle:
            if self.pool is not None and supervisor.pid not in self._not_kept:
                self.pool.give_back(supervisor)
            else:
                self._not_kept.discard(supervisor.pid)
                supervise.discard(supervisor)

    def _revoke(self, force: bool = False) -> None:
        """Take back the job handed on when the job before has run HAND_ON_S (it may run for
        hours: the job handed on would show as running all that time), or when `force`d."""
        handed = self._handed
        if handed is None or handed.revoking:
            return
        if not force and time.monotonic() - handed.at < HAND_ON_S:
            return
        handed.revoking = True
        self._held_up = handed.after  # nothing more is handed on behind that one
        if not supervise.revoke(handed.supervisor):
            self._handed = None  # gone: a pass finds its jobs
            self._dirty = True

    def _orphaned(self, job: Job) -> supervise.Outcome:
        """A supervisor died without a word: what it ran must not hold the GPUs on, unwatched."""
        assert job.pid is not None
        prefix = attempt_prefix(self.logs_dir, job.id, job.attempt)
        # Not this daemon, nor what it runs: started from inside that job (its `queue add`), the
        # daemon carries the job's marks too.
        ours = proctree.descendants(os.getpid()) | {os.getpid()}
        left = proctree.job_processes(job.pid, job.id, str(prefix)) - ours
        for pid in left:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed = f"; its {len(left)} process(es) were killed" if left else ""
        return supervise.Outcome(
            None, "lost", f"its supervisor (pid {job.pid}) was killed; the exit code is unknown{killed}"
        )

    def _exit_record(self, job: Job) -> supervise.Outcome | None:
        prefix = attempt_prefix(self.logs_dir, job.id, job.attempt)
        found = supervise.read_exit(log_paths(prefix)[2], job.attempt)
        if found is not None and not found.ran and (found.ended_at or 0.0) < (job.started_at or 0.0):
            return None  # "never ran", left before this start: that attempt number was used again
        if found is not None and found.outcome == "cancelled" and job.request == "cancel":
            return dataclasses.replace(found, reason="cancelled on request")
        return found

    def _pass(self, store: JobStore, full: bool = True) -> None:
        """Plan and act. Between timed passes only the best-ranked jobs are read (a window): a
        job further back cannot start unless the window leaves a slot or a GPU unused, and then
        the pass reads them all."""
        self._record_start(store)
        version, writes = store.data_version(), store.writes  # the database as the pass reads it
        guess: _Guess | None = None
        for _ in range(10):  # a failed dependency can fail a chain of dependants: settle it
            queued = store.list(["queued"]) if full else store.queued_ranked(self.config.kind_order, WINDOW)
            running = store.list(["running"])
            if self._reconcile(store, running):
                continue
            # CPU-only jobs need no GPU reading: on a GPU box, NVML's first start can take longer
            # than a short job. A full window of them may hide GPU jobs further back, whose start
            # needs the GPUs read to be seen (_capacity_left), so it is skipped only when every
            # queued job was read: in this pass, or in one since which no other connection
            # committed (this daemon's own commits only start, end or queue again the jobs read
            # then). A cold queue's second pass read NVML for nothing: 16 ms before its second job.
            every_job = full or len(queued) < WINDOW
            known = every_job or self._cpu_only_at == version
            cpu_only = known and all(gpu_count_of(j, 1, self.config) == 0 for j in queued)  # on any box
            if every_job:
                self._cpu_only_at = version if cpu_only else None
            gpus = self._gpus() if queued and not cpu_only else []
            paused = store.paused()
            dep_states = self._dep_states(store, queued, running)
            plan = plan_pass(
                queued,
                running,
                dep_states,
                gpus,
                paused,
                self.clock(),
                self.config,
                gpus_unknown=self._nvml_error or "",
                job_memory=functools.partial(self._job_memory, running),
            )
            if not every_job and _capacity_left(running, plan, gpus or [], paused, self.config):
                full = True
                continue
            for job_id, reason in plan.failures.items():
                self.reasons.pop(job_id, None)
                if store.fail_queued(job_id, reason):
                    self.log(f"job {job_id}: failed without running: {reason}")
            # A window that was not filled held every queued job: its reasons are all there are.
            # Merged instead, a job that left the queue without starting (its dependency failed, a
            # cancel) would keep its reason, and with it a spare supervisor, while nothing waits.
            if every_job:
                self.reasons = dict(plan.waits)
            else:
                self.reasons.update(plan.waits)
            by_id = {j.id: j for j in queued}
            for start in plan.starts:
                self._start(store, by_id[start.job_id], start.gpu_uuids)
            for p in plan.preempts:
                self._preempt(store, p.job_id, p.for_job_id)
            # Whether a timed pass may find what no commit shows: a running job's supervisor gone,
            # a running job's time passing (backfill), GPU memory freed outside the queue. With
            # nothing running, queued CPU-only jobs or a queue paused whole wait only on commits
            # (an add, a resume, an edit), which the next wake sees: no timed pass until then.
            self._active = bool(running or plan.starts) or (bool(queued) and QUEUE not in paused and not cpu_only)
            self._busy = bool(queued or running)
            if store.writes == writes:  # nothing changed: what was read is the database now
                guess = self._next_cpu_job(queued, running, dep_states, gpus, paused, version, writes)
            elif plan.starts and self._armed is None:
                self._dirty = True  # plan the next start again, from the database as it is now
            if not plan.failures:
                break
        if not self.last_gpus and not self._nvml_error and (any(j.gpu_uuids for j in running) or set(paused) - {QUEUE}):
            # Only CPU-only jobs were read (or none): the GPUs that jobs hold or that are paused are
            # still named by index (`queue ls`, `daemon status`), read once the starts are made.
            self._gpus()
        self._planned = True
        self._keep_spare(bool(self.reasons))
        self._rearm(guess)
        self._arm(store)
        if self._sampler is not None:
            self._share_state(store)

    def _share_state(self, store: JobStore) -> None:
        """What the ledger's thread reads, each swapped whole."""
        self.running = tuple(store.list(["running"]))
        self.waiting = dict(self.reasons)

    def _start_recording(self, store: JobStore, recording: Callable[[Daemon], Any]) -> None:
        """Start the ledger's sampler: not with the daemon but once a pass finds no job queued
        or running, or RECORDING_AFTER_S after the daemon started: its imports and its thread's first
        samples held back the first jobs of a cold queue (on two CPUs, 30 ms before the second
        of a stream of short jobs). Tried once."""
        self.recording = None
        try:
            sampler = recording(self)
            sampler.start()
        except Exception as exc:  # the queue runs on without its ledger
            self.log(f"GPU use is not recorded: {type(exc).__name__}: {exc}")
            return
        self._sampler = sampler
        self._share_state(store)

    @staticmethod
    def _dep_states(store: JobStore, queued: list[Job], running: list[Job]) -> dict[int, str | None]:
        known = {j.id: j.state for j in (*queued, *running)}
        states: dict[int, str | None] = {}
        for dep in {d for j in queued for d in j.spec.after}:
            if dep in known:
                states[dep] = known[dep]
            else:
                found = store.get(dep)
                states[dep] = found.state if found else None
        return states

    def _keep_spare(self, wanted: bool, ahead: int = 0) -> None:
        """Keep a supervisor forked ahead while jobs wait; none while the queue is empty."""
        if self.pool is None:
            return
        try:
            self.pool.keep(wanted, ahead)
        except OSError as exc:
            self.log(f"could not prepare a supervisor ahead: {exc}")

    def _next_cpu_job(
        self,
        queued: list[Job],
        running: list[Job],
        dep_states: Mapping[int, str | None],
        gpus: list[GpuInfo] | None,
        paused: Mapping[str, float],
        version: int,
        writes: int,
    ) -> _Guess | None:
        """The CPU-only job the plan would start if one of the running CPU-only jobs ended now,
        when every CPU-only slot is taken; None otherwise. The pass has planned and started
        what it could from `queued` and `running`, read from the database as it still is."""
        cpu_running = [j for j in running if not j.gpu_uuids]
        if not cpu_running or len(cpu_running) < self.config.max_cpu_jobs:
            return None
        box = len(gpus) if gpus else 0
        cpu_queued = [j for j in queued if gpu_count_of(j, box, self.config) == 0]
        if not cpu_queued:
            return None
        # With every slot but one taken by the jobs that still run, slots without end: the line in
        # the order it starts.
        plan = plan_pass(
            cpu_queued,
            cpu_running[1:],
            dep_states,
            gpus,
            paused,
            self.clock(),
            self._cpu_config,
            gpus_unknown=self._nvml_error or "",
        )
        if plan.failures or not plan.starts or any(st.gpu_uuids for st in plan.starts):
            return None
        by_id = {j.id: j for j in cpu_queued}
        jobs = tuple(by_id[st.job_id] for st in plan.starts)
        # A job that one read runs after (a GPU job's too): its end is the pass's to handle.
        not_after = frozenset(d for j in queued for d in j.spec.after)
        return _Guess(jobs, version, writes, not_after)

    def _rearm(self, guess: _Guess | None) -> None:
        """Keep the armed spare while the new guess is the job it prepared; else send it away."""
        self._guess = guess
        armed = self._armed
        if armed is None:
            return
        old = armed.guess.job
        if guess is not None and (guess.job.id, guess.job.attempt, guess.job.spec) == (old.id, old.attempt, old.spec):
            self._armed = _Armed(guess, armed.spare, armed.log_prefix)
        else:
            self._disarm()

    def _disarm(self) -> None:
        if self._armed is not None:
            supervise.discard(self._armed.spare)
            self._armed = None

    def _arm(self, store: JobStore) -> None:
        """Hand the guessed next job to a spare ahead of time: it makes the pipes for the job's
        output and builds its environment while the job before runs, and runs it on "go", sent only once the start
        is committed."""
        guess = self._guess
        if guess is None or self._armed is not None or self._handed is not None or self.pool is None:
            return
        if self._hand_on(store, guess):
            return
        if store.writes != guess.writes or store.data_version() != guess.version:
            self._guess = None
            self._dirty = True  # plan again: the queue changed
            return
        spare = self.pool.take_ready()
        if spare is None:
            return  # armed when the spawner sends one
        launch = self._launch(guess.job, ())
        try:
            supervise.prepare(spare, launch)
        except OSError:
            return  # that spare died; the next one is asked for below
        finally:
            self._keep_spare(True)
        self._armed = _Armed(guess, spare, str(launch.log_prefix))

    def _launch(self, job: Job, gpu_uuids: tuple[str, ...]) -> supervise.Launch:
        attempt = job.attempt + 1
        return supervise.Launch(
            job_id=job.id,
            attempt=attempt,
            spec=job.spec,
            gpu_uuids=gpu_uuids,
            log_prefix=attempt_prefix(self.logs_dir, job.id, attempt),
            boot_id=self.boot,
            grace_s=self.config.kill_grace_s,
            daemon_pid=os.getpid(),
            socket_path=self.socket_path,
            lock_path=self._lock_path,
            db_path=self.db_path,
        )

    def _start(self, store: JobStore, job: Job, gpu_uuids: tuple[str, ...]) -> None:
        attempt = job.attempt + 1
        armed = self._armed
        if armed is not None and not gpu_uuids and armed.guess.job.id == job.id:
            self._armed = None
            old = armed.guess.job
            if (old.attempt, old.spec) != (job.attempt, job.spec):
                supervise.discard(armed.spare)  # prepared for the job as it was
            else:
                try:
                    started = store.mark_started(
                        job.id,
                        armed.spare.pid,
                        (),
                        self.boot,
                        str(attempt_prefix(self.logs_dir, job.id, attempt)),
                        pid_start=armed.spare.pid_start,
                        expect=job.spec,
                    )
                except BaseException:
                    supervise.discard(armed.spare)  # not recorded: it runs nothing, and exits
                    raise
                if started:
                    self._go(store, job, armed.spare, cpu_only=True)  # the spare armed for this very job
                    return
                supervise.discard(armed.spare)  # the job changed under us (cancelled, edited)
                self._dirty = True
                return
        launch = self._launch(job, gpu_uuids)
        for _ in range(3):  # a spare that died meanwhile is replaced
            try:
                assert self.pool is not None
                spare = self.pool.take()
            except OSError as exc:
                self.log(f"job {job.id}: could not start a supervisor ({exc}); trying again later")
                return
            # The launch first, then the recorded start, then "go": a spare that gets EOF instead
            # of "go" (this daemon killed between the two) knows what to look up.
            try:
                supervise.prepare(spare, launch)
            except OSError:
                continue  # that spare died
            try:
                started = store.mark_started(
                    job.id,
                    spare.pid,
                    gpu_uuids,
                    self.boot,
                    str(launch.log_prefix),
                    pid_start=spare.pid_start,
                    expect=job.spec,
                )
            except BaseException:
                supervise.discard(spare)  # not recorded (a full disk, say): it runs nothing, and exits
                raise
            if not started:
                supervise.discard(spare)  # the job changed under us (cancelled, edited); it runs nothing
                self._dirty = True
                return
            if self._go(store, job, spare, cpu_only=not gpu_uuids):
                return

    def _preempt(self, store: JobStore, job_id: int, for_job: int) -> None:
        job = store.request_stop(job_id, "preempt")
        if job.request != "preempt":
            return  # cancelled meanwhile: the cancel stands
        if job.state == "running" and job.pid is not None and proctree.is_alive(job.pid, job.pid_start):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(job.pid, signal.SIGUSR1)  # the supervisor's "preempt": stop the tree, then requeue
            self.log(f"job {job_id} (batch) preempted for job {for_job} (infer)")


WINDOW = 32  # jobs read per event-driven pass
RECORDING_AFTER_S = 2.0  # the ledger's sampler starts at the latest this long after the daemon
REFRESH_S = 0.25  # a pass at most this long after a start made without one
STATE_CHECK_S = 0.02  # how often a busy daemon looks whether its state folder was replaced
HAND_ON_S = 0.1  # how long a job handed on may wait behind the job running before it is taken back
STREAM_S = 0.1  # jobs are handed on after a CPU-only job that ran less than this
# Supervisors kept forked ahead while jobs wait; the next is forked while a job runs. More did
# not help on a 2-core box: they compete with the running job for the CPUs.
SPARES = 1


def _end_attempt(
    store: JobStore, job_id: int, attempt: int, outcome: supervise.Outcome
) -> tuple[str, str | None] | None:
    """store.end_attempt with what a supervisor said of the end (the fast ways from one job to the next)."""
    return store.end_attempt(job_id, attempt, outcome.exit_code, outcome.outcome, outcome.reason, outcome.ended_at)


def _keeps(outcome: supervise.Outcome, asked: bool) -> bool:
    """Whether a supervisor may run another job after this one: not when anyone asked to stop its
    job, nor when a signal stopped it (someone's `kill`): another may be on its way to it."""
    return not asked and outcome.ran and outcome.outcome not in ("cancelled", "preempted")


def _pipe(held: ExitStack) -> tuple[int, int]:
    """A non-blocking pipe whose ends `held` closes."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    held.callback(os.close, r)
    held.callback(os.close, w)
    return r, w


def _say(line: str) -> None:
    """A line in the daemon's log (its stderr). On a full disk the line is lost, not the daemon:
    it says why a pass failed, and a log it cannot write must not end it."""
    with suppress(OSError, ValueError):  # ValueError: stderr closed
        print(f"gpubox daemon: {line}", file=sys.stderr, flush=True)


def _drain(fd: int, size: int = 65536) -> bytes:
    """What the pipe holds now. A read that comes back short emptied it: no second read to be
    told so (EAGAIN), on the way from one job to the next."""
    data = b""
    with suppress(OSError):  # EAGAIN: empty
        while len(chunk := os.read(fd, size)) == size:
            data += chunk
        data += chunk
    return data


def _capacity_left(
    running: list[Job], plan: Plan, gpus: list[GpuInfo], paused: Mapping[str, float], config: QueueConfig
) -> bool:
    """Whether a slot or a GPU is still unused after the plan: then jobs beyond the window count."""
    cpu = sum(1 for j in running if not j.gpu_uuids) + sum(1 for st in plan.starts if not st.gpu_uuids)
    if cpu < config.max_cpu_jobs:
        return True
    held = {u for j in running for u in j.gpu_uuids} | {u for st in plan.starts for u in st.gpu_uuids}
    return any(g.uuid not in held and g.uuid not in paused for g in gpus)
