"""When the daemon fails to record an end, nothing is left hanging: the supervisor whose end was
not recorded leaves its exit record, the others read with it are recorded all the same, and a
job that never ran is queued again, not ended. The daemon runs with one store call made to fail
once (a database locked past its timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gpubox.queue import proctree
from tests.queue.conftest import QueueBox, wait_until
from tests.queue.test_queue_processes import END_STATES, HANG, hold_until

FAILING_ONCE = r"""
import os, sys, time
import gpubox.queue.daemon as daemon
import gpubox.queue.store as store
name = os.environ["FAIL_ONCE"]
real = getattr(store.JobStore, name)
calls = []
def once(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 1:
        raise store.StoreError("the job database is unavailable (database is locked)")
    return real(self, *args, **kwargs)
setattr(store.JobStore, name, once)
if os.environ.get("SLOW_DRAIN"):
    drain = daemon._drain
    def slow(fd):
        time.sleep(0.5)  # the done lines of jobs that end together come in one read
        return drain(fd)
    daemon._drain = slow
sys.argv = ["gpubox", "daemon"]
from gpubox.cli.main import main
raise SystemExit(main())
"""


def start_failing_once(queue: QueueBox, method: str, **env: str) -> None:
    with open(queue.home / "daemon.log", "ab") as log:
        subprocess.Popen(
            [sys.executable, "-c", FAILING_ONCE],
            env={**os.environ, **queue.env, **queue.extra_env, "FAIL_ONCE": method, **env},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_until(lambda: queue.daemon_pid() is not None and queue.socket.exists(), HANG, "the daemon to listen")


def test_a_failed_record_leaves_the_other_ends_read_with_it_recorded(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "2"
    start_failing_once(queue, "finish", SLOW_DRAIN="1")
    go = tmp_path / "go"
    ids = [queue.add("--gpus", "0", "--shell", "--", f"{hold_until(go)}; exit {code}") for code in (3, 4)]
    for job_id in ids:
        queue.wait_state(job_id, ("running",), timeout=HANG)
    go.touch()  # both end together: their done lines come in one read, and the first record fails
    rows = [queue.wait_state(job_id, END_STATES, timeout=HANG) for job_id in ids]
    assert [(r["state"], r["exit_code"]) for r in rows] == [("failed", 3), ("failed", 4)]
    for row in rows:  # and no supervisor is left waiting for a word that never comes
        wait_until(lambda: not proctree.is_alive(row["pid"], row["pid_start"]), HANG, "the supervisors to go")  # noqa: B023
    assert "database is locked" in (queue.home / "daemon.log").read_text()
    # The failed one came from its exit record; the other was recorded from its done line, at once
    # (its supervisor was told, so it left no exit record).
    records = [(queue.state_dir / "logs" / f"{job_id}.1.exit").exists() for job_id in ids]
    assert sorted(records) == [False, True]


def test_a_job_that_never_ran_is_queued_again_when_its_end_comes_from_the_exit_record(
    queue: QueueBox, tmp_path: Path
) -> None:
    """A stop signal sent to a supervisor while it idles stops the job it gets next before that
    runs: the job is queued again, also when the daemon reads that from the exit record."""
    start_failing_once(queue, "abandon_start")
    go, ran = tmp_path / "go", tmp_path / "ran"
    first = queue.add("--gpus", "0", "--shell", "--", hold_until(go))
    row = queue.wait_state(first, ("running",), timeout=HANG)
    second = queue.add("--gpus", "0", "--shell", "--", f"touch {ran}")
    assert queue("queue", "pause").returncode == 0  # the second waits: the supervisor is kept, idle
    go.touch()
    queue.wait_state(first, ("succeeded",), timeout=HANG)
    comm = Path(f"/proc/{row['pid']}/comm")
    wait_until(lambda: comm.read_text().strip() == "gpubox-idle", HANG, "the supervisor to idle")
    os.kill(row["pid"], signal.SIGTERM)  # someone's stray kill
    assert queue("queue", "resume").returncode == 0
    assert queue.wait_state(second, END_STATES, timeout=HANG)["state"] == "succeeded"
    assert ran.exists()
    # Its first start, stopped before the job ran, was taken back: one attempt, the one that ran.
    assert queue.rows(f"SELECT number, outcome FROM attempts WHERE job_id = {second}") == [(1, "succeeded")]
    assert "database is locked" in (queue.home / "daemon.log").read_text()


SPAWNER_FAILS_ONCE = r"""
import sys
import gpubox.queue.spawner as spawner
real = spawner.Spawner.start
calls = []
def start(self):
    calls.append(1)
    if len(calls) == 1:
        raise BlockingIOError(11, "Resource temporarily unavailable")  # a process limit, say
    return real(self)
spawner.Spawner.start = start
sys.argv = ["gpubox", "daemon"]
from gpubox.cli.main import main
raise SystemExit(main())
"""


def test_a_spawner_that_cannot_start_with_the_daemon_is_started_for_the_first_job(queue: QueueBox) -> None:
    with open(queue.home / "daemon.log", "ab") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-c", SPAWNER_FAILS_ONCE],
            env={**os.environ, **queue.env, **queue.extra_env},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_until(lambda: queue.daemon_pid() == daemon.pid and queue.socket.exists(), HANG, "the daemon to listen")
    job = queue.add("--gpus", "0", "--", "true")
    assert queue.wait_state(job, END_STATES, timeout=HANG)["state"] == "succeeded"
    assert daemon.poll() is None  # the daemon lives on
    assert "could not start the supervisor spawner" in (queue.home / "daemon.log").read_text()


def test_a_start_that_cannot_be_recorded_sends_its_prepared_supervisor_away(queue: QueueBox) -> None:
    """A full disk, say: the supervisor prepared for the start runs nothing and exits, instead of
    waiting for ever beside every later try."""
    start_failing_once(queue, "mark_started")
    job = queue.add("--gpus", "0", "--", "true")
    assert queue.wait_state(job, END_STATES, timeout=HANG)["state"] == "succeeded"
    daemon = queue.daemon_pid()
    assert daemon is not None

    def named_for_the_job() -> list[int]:
        # The supervisor that ran the job idles under its own name; none may wait, named for it.
        return [p for p in proctree.descendants(daemon) if _comm(p) == f"gpubox-job{job}"]

    wait_until(lambda: not named_for_the_job(), HANG, "no supervisor left waiting")
    assert queue.rows(f"SELECT number, outcome FROM attempts WHERE job_id = {job}") == [(1, "succeeded")]
    assert "database is locked" in (queue.home / "daemon.log").read_text()


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
