"""The daemon on a shared box in trouble: a database someone holds locked, a state folder removed
under it, a clock set back. It goes on (or steps aside) without losing or hiding a job."""

from __future__ import annotations

import errno
import io
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpubox.paths import Paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import JobSpec, JobStore, StoreError
from tests.queue.conftest import Clock, NoGpus, QueueBox, wait_until
from tests.queue.test_queue_processes import HANG, hold_until


def start_unwatched_daemon(queue: QueueBox, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`gpubox daemon` in the background, without waiting for it to listen."""
    with open(queue.home / "daemon-test.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gpubox", "daemon"],
            env={**os.environ, **queue.env, **env},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_a_daemon_started_while_the_database_is_held_locked_waits_for_it(queue: QueueBox, tmp_path: Path) -> None:
    """A backup or an sqlite3 shell holding the write lock longer than the busy timeout: the
    daemon says so and tries again, then marks lost what ran before the reboot and runs the rest."""
    ran = tmp_path / "ran"
    with JobStore(queue.db) as store:
        before = store.add(JobSpec(argv=("true",), gpus=0))
        assert store.mark_started(before.id, 1 << 30, (), "boot-before")  # no such pid
        waiting = store.add(JobSpec(argv=("sh", "-c", f"echo ran > {ran}"), gpus=0))
    holder = sqlite3.connect(queue.db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        daemon = start_unwatched_daemon(queue, {"GPUBOX_BOOT_ID": "boot-now"})
        log = queue.home / "daemon-test.log"
        wait_until(
            lambda: "database is locked" in log.read_text() or daemon.poll() is not None, HANG, "the daemon to try"
        )
        assert daemon.poll() is None, log.read_text()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    row = queue.wait_state(waiting.id, ("succeeded", "failed", "lost"), timeout=HANG)
    assert row["state"] == "succeeded"
    assert ran.read_text() == "ran\n"
    lost = queue.job(before.id)
    assert (lost["state"], lost["reason"]) == ("lost", "the machine restarted while the job ran")
    assert daemon.poll() is None and queue.daemon_pid() == daemon.pid


def test_timed_passes_go_on_after_the_clock_is_set_back(paths: Paths) -> None:
    """The timed pass is what notices a supervisor killed with SIGKILL and GPU memory freed
    outside the queue: a clock set back an hour (NTP, a person) must not hold it for that hour."""
    clock = Clock(10_000.0)
    daemon = Daemon(paths, QueueConfig(poll_interval_s=0.05), gpu_source=NoGpus(), clock=clock)
    full_passes: list[float] = []

    def counting_pass(store: object, full: bool = True) -> None:
        if full:
            full_passes.append(clock.now)
            clock.now -= 3600.0  # set back after each pass
        if len(full_passes) == 3:
            daemon._stop = True

    daemon._pass = counting_pass  # type: ignore[method-assign]
    guard = threading.Timer(HANG, lambda: setattr(daemon, "_stop", True))  # only against a hang
    guard.start()
    try:
        daemon.run()
    finally:
        guard.cancel()
    assert full_passes == [10_000.0, 6400.0, 2800.0]


def test_a_daemon_whose_state_folder_is_removed_steps_aside(queue: QueueBox, tmp_path: Path) -> None:
    """`rm -rf` of the state folder to start afresh while jobs run: the old daemon runs nothing
    more of the old queue, where nobody could see or cancel it, and leaves the socket of the
    daemon that serves the new folder alone."""
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "1"
    # Woken only by its job's end: the new daemon is up by then.
    old = queue.start_daemon(env={"GPUBOX_QUEUE_POLL_INTERVAL": "3600"})
    release, ran = tmp_path / "release", tmp_path / "ran"
    first = queue.add("--gpus", "0", "--shell", "--", hold_until(release))
    second = queue.add("--gpus", "0", "--shell", "--", f"echo second >> {ran}")
    queue.wait_state(first, ("running",), timeout=HANG)
    assert queue.job(second)["state"] == "queued"
    old_socket = os.stat(queue.socket).st_ino

    shutil.rmtree(queue.state_dir)
    new = queue.start_daemon()
    wait_until(lambda: queue.daemon_pid() == new.pid, HANG, "the new daemon to take its lock")
    wait_until(lambda: os.stat(queue.socket).st_ino != old_socket, HANG, "the new daemon to listen")

    release.touch()  # the old daemon hears of its job's end
    # Exit 1: a service manager that restarts it on failure brings up a daemon for the new folder.
    assert old.wait(timeout=HANG) == 1
    assert not ran.exists()
    log = (queue.home / "daemon-test.log").read_text()
    assert f"the state folder {queue.state_dir} was removed or replaced under this daemon; stopping" in log
    status = queue("daemon", "status")
    assert status.returncode == 0 and f"pid {new.pid}" in status.stdout, status.stderr
    assert new.poll() is None


def has_open(pid: int, path: Path) -> bool:
    """Whether the process holds `path` open: a client that has opened the database."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fds / fd) == str(path) for fd in os.listdir(fds))
    except OSError:
        return False


@pytest.mark.parametrize("command", [("queue", "wait"), ("queue", "logs", "-f")], ids=["wait", "logs -f"])
def test_a_client_waiting_on_a_removed_state_folder_says_so(
    queue: QueueBox, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """What it reads from the removed database never changes again: it would wait for ever."""
    release = tmp_path / "release"
    job = queue.add("--gpus", "0", "--shell", "--", hold_until(release))
    queue.wait_state(job, ("running",), timeout=HANG)
    client = subprocess.Popen(
        [sys.executable, "-m", "gpubox", *command, str(job)],
        env={**os.environ, **queue.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: has_open(client.pid, queue.db), HANG, "the client to open the database")
        shutil.rmtree(queue.state_dir)
        _, err = client.communicate(timeout=HANG)
    finally:
        client.kill()
        release.touch()
    assert err == f"gpubox: the job database {queue.db} was removed or replaced while this command used it\n"
    assert client.returncode == 1


class FullDisk(io.TextIOBase):
    """A stderr on a full disk: every write fails."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_daemon_whose_log_cannot_be_written_goes_on(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full disk the daemon's passes fail (it says so in its log, which fails too): it must
    go on trying, not exit and leave the queue to wait for a client."""
    daemon = Daemon(paths, QueueConfig(poll_interval_s=0.05), gpu_source=NoGpus())
    failures = [StoreError("the job database x failed (database or disk is full)")] * 3

    def failing_pass(store: object, full: bool = True) -> None:
        if failures:
            raise failures.pop()
        daemon._stop = True  # the disk has room again: one pass that works, then stop

    daemon._pass = failing_pass  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", FullDisk())
    assert daemon.run() == 0
    assert not failures


@pytest.mark.parametrize("failing", ["database", "pipe"])
def test_a_daemon_that_cannot_start_gives_back_what_it_took(
    paths: Paths, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A daemon run inside a longer process (a test, a benchmark) that fails on its way up, on a
    damaged database or with no descriptor left for a pipe, leaves no lock held, no checkpoint
    thread and no file open: another daemon can start there at once."""
    from gpubox.queue.layout import lock_holder

    paths.state_dir.mkdir(parents=True)
    if failing == "database":
        (paths.state_dir / "queue.db").write_bytes(b"not a database" * 600)
    else:

        def no_pipe(flags: int) -> tuple[int, int]:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(os, "pipe2", no_pipe)
    fds = set(os.listdir("/proc/self/fd"))
    with pytest.raises((StoreError, OSError)):
        Daemon(paths, QueueConfig(), gpu_source=NoGpus(), log=lambda line: None).run()
    monkeypatch.undo()
    assert lock_holder(paths) is None
    assert not [t for t in threading.enumerate() if t.name == "gpubox-checkpoint"]
    assert set(os.listdir("/proc/self/fd")) <= fds | {str(n) for n in range(3)}
