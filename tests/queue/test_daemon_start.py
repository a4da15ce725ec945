"""`gpubox daemon start`: the daemon in the background, as the first queue command that needs it
starts it (pueue's `pueued -d`), for a box where nothing else starts it and no job is to be added."""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys

from tests.queue.conftest import QueueBox, blocked_in, wait_until


def test_start_starts_one_daemon_and_says_so_when_one_runs(queue: QueueBox) -> None:
    try:
        first = queue("daemon", "start", timeout=60)
        assert first.returncode == 0, first.stderr
        pid = queue.daemon_pid()
        assert pid is not None and first.stdout == f"started the daemon (pid {pid})\n"
        assert queue("daemon", "status").returncode == 0  # it answers once start returns
        again = queue("daemon", "start", timeout=60)
        assert (again.returncode, again.stdout, again.stderr) == (0, f"the daemon runs already (pid {pid})\n", "")
        assert queue.daemon_pid() == pid
    finally:
        queue("daemon", "stop")


def test_a_daemon_that_stops_at_once_is_reported_with_what_it_said(queue: QueueBox) -> None:
    queue.state_dir.mkdir(parents=True)
    queue.db.write_bytes(random.Random(5).randbytes(8192))
    result = queue("daemon", "start", timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("gpubox: the daemon stopped at once: the job database") and "corrupt" in line, line
    assert queue.daemon_pid() is None


def test_bad_input_starts_nothing(queue: QueueBox) -> None:
    for args, env, said in [
        (("--timeout", "0"), {}, "invalid --timeout 0"),
        ((), {"GPUBOX_QUEUE_MAX_CPU_JOBS": "-1"}, "queue.max_cpu_jobs: must be a whole number"),
    ]:
        result = queue("daemon", "start", *args, env=env, timeout=60)
        assert result.returncode == 2 and said in result.stderr and len(result.stderr.splitlines()) == 1
        assert queue.daemon_pid() is None


def test_a_queued_job_with_no_daemon_says_how_to_start_one(queue: QueueBox) -> None:
    assert queue("queue", "pause").returncode == 0  # the job stays queued
    added = queue("queue", "add", "--gpus", "0", "--", "true")
    assert added.returncode == 0, added.stderr
    assert queue("daemon", "stop").returncode == 0
    listed = queue("queue", "ls")
    [row] = listed.stdout.splitlines()[1:]
    assert row.startswith(added.stdout.strip()) and row.endswith("the daemon is not running (gpubox daemon start)")


def _starting_lock(queue: QueueBox) -> int:
    """Hold daemon.starting as a client-started daemon does from its launch on (as this test's)."""
    queue.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(queue.state_dir / "daemon.starting", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_stop_waits_for_a_daemon_that_is_still_starting_and_stops_it(queue: QueueBox) -> None:
    """`queue add; daemon stop`: the daemon the add started may not hold its lock yet. Stop must
    not say "not running" and leave it to run on."""
    fd = _starting_lock(queue)
    try:
        stop = subprocess.Popen(
            [sys.executable, "-m", "gpubox", "daemon", "stop"],
            env={**os.environ, **queue.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The daemon comes up while stop waits: after stop has looked and found no daemon (a stop
        # that did not wait would have said "not running" by then, and not slept), and not waited
        # for here, as stop may end it at once.
        wait_until(lambda: blocked_in(stop.pid, "nanosleep") or stop.poll() is not None, 30, "stop to wait")
        assert stop.poll() is None, stop.communicate()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpubox", "daemon"],
            env={**os.environ, **queue.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out, err = stop.communicate(timeout=60)
        assert (stop.returncode, err) == (0, ""), err
        assert out == f"stopped the daemon (pid {daemon.pid}); running jobs go on\n"
        assert daemon.wait(timeout=30) == 0 and queue.daemon_pid() is None
    finally:
        os.close(fd)
        queue("daemon", "stop")


def test_stop_with_nothing_starting_says_none_was_running(queue: QueueBox) -> None:
    queue.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    (queue.state_dir / "daemon.starting").touch()  # left by a daemon that has ended: no lock on it
    result = queue("daemon", "stop")
    assert (result.returncode, result.stdout) == (0, "the daemon was not running\n")
