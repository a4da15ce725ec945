"""A daemon killed while it starts a job: the job runs once, never zero times, never twice.

The daemon hands the launch to a supervisor, records the start, then says "go". Killed after the
record and before "go", the supervisor reads EOF, finds its start recorded and runs the job (a
later daemon records its end); killed before the record, it runs nothing and the job waits for
the next daemon. The daemon here kills itself (SIGKILL) at one of those points of its first or
second start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.queue import proctree
from tests.queue.conftest import QueueBox, wait_until
from tests.queue.test_queue_processes import HANG, hold_until, lines

KILLED_AT = r"""
import os, signal, sys
import gpubox.queue.daemon as daemon
import gpubox.queue.supervise as supervise
import gpubox.queue.store as store
where, nth = os.environ["KILL_AT"].split(":")
owner = supervise if where in ("go", "prepare") else store.JobStore
real = getattr(owner, where)
calls = []
def killing(*args, **kwargs):
    calls.append(1)
    if len(calls) == int(nth):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(owner, where, killing)
sys.argv = ["gpubox", "daemon"]
from gpubox.cli.main import main
raise SystemExit(main())
"""


def start_killed_at(queue: QueueBox, where: str) -> subprocess.Popen[bytes]:
    with open(queue.home / "daemon.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", KILLED_AT],
            env={**os.environ, **queue.env, **queue.extra_env, "KILL_AT": where},
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@pytest.mark.parametrize(
    ("where", "recorded"),
    [("go:1", True), ("mark_started:1", False), ("prepare:1", False), ("go:2", True)],
    ids=[
        "after the record, first start",
        "at the record",
        "before the launch is handed over",
        "after the record, a prepared next start",
    ],
)
def test_a_job_whose_start_the_daemon_died_in_runs_once(
    queue: QueueBox, tmp_path: Path, where: str, recorded: bool
) -> None:
    ran, release = tmp_path / "ran", tmp_path / "release"
    daemon = start_killed_at(queue, where)
    wait_until(lambda: queue.daemon_pid() == daemon.pid and queue.socket.exists(), HANG, "the daemon to listen")
    if where == "go:2":
        # The first job runs while the second is prepared; its end takes the fast way to the
        # second's start, and the daemon dies between recording that start and "go".
        first = queue.add("--gpus", "0", "--shell", "--", f"echo first >> {ran}; {hold_until(release)}")
        queue.wait_state(first, ("running",), timeout=HANG)
    job = queue.add("--gpus", "0", "--shell", "--", f"echo job >> {ran}")
    if where == "go:2":
        wait_until(lambda: f"gpubox-job{job}" in queue.processes().values(), HANG, "the second job to be prepared")
        release.touch()
    assert daemon.wait(timeout=HANG) == -9
    row = queue.job(job)
    assert row["state"] == ("running" if recorded else "queued")
    if recorded:
        # No daemon runs: the supervisor ran the job on its own, and left its end for the next.
        wait_until(lambda: "job" in lines(ran), HANG, "the job to run")
        wait_until(lambda: not proctree.is_alive(row["pid"], row["pid_start"]), HANG, "its supervisor to end")
        assert (queue.state_dir / "logs" / f"{job}.1.exit").exists()
    else:
        wait_until(lambda: f"gpubox-job{job}" not in queue.processes().values(), HANG, "no spare")
        assert "job" not in lines(ran)
    waited = queue("queue", "wait", str(job), timeout=HANG)  # starts a daemon, which records or runs it
    assert waited.returncode == 0, waited.stderr
    assert lines(ran).count("job") == 1
    assert queue.rows(f"SELECT number, outcome FROM attempts WHERE job_id = {job}") == [(1, "succeeded")]
