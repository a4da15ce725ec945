"""`--json` on the queue's commands: a command that fails still prints one envelope (`data` null,
the message in `errors`), and every envelope's `exit_code` is the one the command exits with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpubox.cli.daemon as daemon_cli
from gpubox.paths import resolve_paths
from gpubox.queue import wire
from gpubox.queue.records import DAEMON_DOWN
from tests.queue.conftest import QueueBox, alive, wait_until

WAIT = 60.0


def envelope(result: Any) -> dict[str, Any]:
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.returncode and doc["ok"] == (result.returncode == 0), doc
    return dict(doc)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("queue", "add", "--json", "--kind", "bogus", "--", "true"), 2, "unknown kind 'bogus'"),
        (("queue", "add", "--json", "--gpus", "0", "--after", "99", "--", "true"), 2, "job 99"),
        (("queue", "show", "9999", "--json"), 2, "job 9999 does not exist"),
        (("queue", "ls", "--json", "--state", "bogus"), 2, "unknown state 'bogus'"),
        (("queue", "wait", "9999", "--json"), 2, "job 9999 does not exist"),
        (("queue", "wait", "9999", "--json", "--timeout", "x"), 2, "invalid duration 'x'"),
        (("queue", "cancel", "9999", "--json"), 2, "job 9999 does not exist"),
        (("queue", "retry", "9999", "--json"), 2, "job 9999 does not exist"),
        (("queue", "edit", "9999", "--priority", "1", "--json"), 2, "job 9999 does not exist"),
        (("queue", "clean", "--older-than", "x", "--json"), 2, "invalid duration 'x'"),
    ],
)
def test_a_failed_command_prints_an_envelope_and_its_one_line(
    queue: QueueBox, args: tuple[str, ...], code: int, message: str
) -> None:
    result = queue(*args)
    assert result.returncode == code, result.stderr
    doc = envelope(result)
    assert doc["command"] == f"{args[0]} {args[1]}" and doc["data"] is None
    assert len(doc["errors"]) == 1 and message in doc["errors"][0]
    assert result.stderr == f"gpubox: {doc['errors'][0]}\n"


def test_wait_says_the_jobs_exit_code_in_the_envelope_and_a_cancel_of_an_ended_job_fails(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "sh", "-c", "exit 7")
    waited = queue("queue", "wait", str(job), "--json")
    assert waited.returncode == 7
    doc = envelope(waited)
    assert doc["data"]["exit_code"] == 7 and doc["data"]["jobs"][0]["state"] == "failed"
    cancelled = queue("queue", "cancel", str(job), "--json")
    assert cancelled.returncode == 1
    doc = envelope(cancelled)
    assert doc["errors"] == [f"job {job} ended already (failed)"]
    assert doc["data"]["jobs"][0]["action"] == "ended already"
    assert cancelled.stderr == f"gpubox: job {job} ended already (failed)\n"


def test_a_job_just_added_is_not_said_to_wait_for_a_daemon_that_runs(queue: QueueBox) -> None:
    queue.start_daemon()
    assert queue("queue", "pause").returncode == 0
    added = queue("queue", "add", "--json", "--gpus", "0", "--", "true")
    assert added.returncode == 0, added.stderr
    [record] = envelope(added)["data"]["jobs"]
    assert record["state"] == "queued" and record["reason"] != DAEMON_DOWN


def test_a_cancel_while_no_daemon_runs_starts_one_that_records_the_end(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "sleep", "300")
    queue.wait_state(job, ("running",), WAIT)
    assert queue("daemon", "stop").returncode == 0
    stopped = queue("queue", "cancel", str(job))
    assert stopped.returncode == 0 and stopped.stdout == f"job {job}: stopping\n", stopped.stderr
    row = queue.wait_state(job, ("cancelled",), WAIT)  # no other command needed
    assert row["exit_code"] == 143


def test_status_waits_for_a_daemon_that_holds_its_lock_but_does_not_listen_yet(
    queue: QueueBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries: list[int] = []

    def ask(path: Any, op: str, timeout: float = 5.0) -> dict[str, Any]:
        tries.append(1)
        if len(tries) < 3:
            raise wire.Unreachable("no socket yet")
        return {"pid": 42}

    monkeypatch.setattr(wire, "ask", ask)
    monkeypatch.setattr("gpubox.queue.layout.lock_holder", lambda paths: 42)
    assert daemon_cli._ask_status(resolve_paths()) == {"pid": 42} and len(tries) == 3
    # A daemon a client launched, before it takes its lock: waited for too.
    tries.clear()
    monkeypatch.setattr("gpubox.queue.layout.lock_holder", lambda paths: None)
    monkeypatch.setattr("gpubox.queue.client.daemon_starting", lambda paths: True)
    assert daemon_cli._ask_status(resolve_paths()) == {"pid": 42} and len(tries) == 3
    # Nobody holds the lock and nothing is starting: none is waited for.
    tries.clear()
    monkeypatch.setattr("gpubox.queue.client.daemon_starting", lambda paths: False)
    with pytest.raises(wire.Unreachable):
        daemon_cli._ask_status(resolve_paths())
    assert tries == [1]


# When no daemon can be started (here: its log, a directory, cannot be opened), a command that
# changed the queue says what it did all the same, then fails with exit 4.

NO_DAEMON = "could not start the daemon (Is a directory): queued jobs wait until `gpubox daemon` runs"


def no_daemon_can_start(queue: QueueBox) -> None:
    log = queue.state_dir / "daemon.log"
    log.unlink(missing_ok=True)
    log.mkdir(parents=True)


def test_add_with_no_daemon_says_the_jobs_and_that_they_wait_for_it(queue: QueueBox) -> None:
    no_daemon_can_start(queue)
    added = queue("queue", "add", "--json", "--gpus", "0", "--", "true")
    assert added.returncode == 4
    doc = envelope(added)
    assert doc["errors"] == [NO_DAEMON] and added.stderr == f"gpubox: {NO_DAEMON}\n"
    [record] = doc["data"]["jobs"]
    assert record["state"] == "queued" and record["reason"] == DAEMON_DOWN


def test_add_wait_with_no_daemon_says_the_ids_and_fails_without_waiting(queue: QueueBox) -> None:
    no_daemon_can_start(queue)
    result = queue("queue", "add", "--gpus", "0", "--wait", "--", "true", timeout=30)
    job = int(result.stdout)
    assert (result.returncode, result.stderr) == (4, f"gpubox: {NO_DAEMON}\n")
    assert queue.job(job)["state"] == "queued"
    added = queue("queue", "add", "--gpus", "0", "--wait", "--json", "--", "true", timeout=30)
    doc = envelope(added)  # the add's own document, as without --wait
    assert added.returncode == 4 and doc["errors"] == [NO_DAEMON]
    assert [r["state"] for r in doc["data"]["jobs"]] == ["queued"]


def test_retry_edit_and_cancel_with_no_daemon_say_what_they_did(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "false")
    queue.wait_state(job, ("failed",), WAIT)
    running = queue.add("--gpus", "0", "--", "sleep", "300")
    queue.wait_state(running, ("running",), WAIT)
    sleeper = envelope(queue("queue", "show", str(running), "--json"))["data"]["job"]["job_pid"]
    assert queue("daemon", "stop").returncode == 0
    no_daemon_can_start(queue)
    retried = queue("queue", "retry", str(job))
    assert (retried.returncode, retried.stdout, retried.stderr) == (4, f"job {job}: queued\n", f"gpubox: {NO_DAEMON}\n")
    edited = queue("queue", "edit", str(job), "--priority", "3", "--json")
    assert edited.returncode == 4
    doc = envelope(edited)
    assert doc["data"]["job"]["priority"] == 3 and doc["errors"] == [NO_DAEMON]
    cancelled = queue("queue", "cancel", str(running), str(job), "--json")
    assert cancelled.returncode == 4
    doc = envelope(cancelled)
    # The running job was stopped all the same; what waits for a daemon is the record of its end.
    stopped = NO_DAEMON.replace("queued jobs wait until", "the end of a job stopped here is recorded once")
    assert [j["action"] for j in doc["data"]["jobs"]] == ["stopping", "cancelled"] and doc["errors"] == [stopped]
    assert queue.job(job)["state"] == "cancelled"
    wait_until(lambda: not alive(sleeper), WAIT, "the stopped job to exit")


def test_resume_with_nothing_paused_needs_no_daemon(queue: QueueBox) -> None:
    no_daemon_can_start(queue)
    resumed = queue("queue", "resume")
    assert (resumed.returncode, resumed.stdout, resumed.stderr) == (0, "the queue: was not paused\n", "")
    assert queue("queue", "pause").returncode == 0
    resumed = queue("queue", "resume")
    assert (resumed.returncode, resumed.stdout) == (4, "the queue: resumed\n")
    assert resumed.stderr == f"gpubox: {NO_DAEMON}\n"


def test_a_bad_setting_refuses_a_retry_before_it_is_made(queue: QueueBox) -> None:
    """A daemon that would stop on its settings could never run the job: nothing is queued again,
    and the exit code is the setting's (2), as for `queue add`, not 4 after a committed change."""
    job = queue.add("--gpus", "0", "--", "false")
    queue.wait_state(job, ("failed",), WAIT)
    assert queue("daemon", "stop").returncode == 0
    retried = queue("queue", "retry", str(job), "--json", env={"GPUBOX_QUEUE_PREEMPT": "2"})
    assert retried.returncode == 2
    assert retried.stderr.startswith("gpubox: environment variable GPUBOX_QUEUE_PREEMPT")
    doc = envelope(retried)
    assert doc["data"] is None and doc["errors"] == [retried.stderr.removeprefix("gpubox: ").rstrip("\n")]
    assert queue.job(job)["state"] == "failed"


def test_a_job_that_cancels_itself_while_no_daemon_runs_is_recorded_cancelled(queue: QueueBox, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        f"while [ ! -e {go} ]; do sleep 0.02; done; {sys.executable} -m gpubox queue cancel $GPUBOX_JOB_ID; sleep 300"
    )
    job = queue.add("--gpus", "0", "--shell", "--", script)
    queue.wait_state(job, ("running",), WAIT)
    assert queue("daemon", "stop").returncode == 0
    go.touch()
    assert queue.wait_state(job, ("cancelled",), WAIT)["exit_code"] == 143


def test_add_from_a_directory_that_was_removed_prints_an_envelope(queue: QueueBox, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    result = subprocess.run(
        [
            "sh",
            "-c",
            f'cd {gone} && rmdir {gone} && exec "$0" -m gpubox queue add --json --gpus 0 -- true',
            sys.executable,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **queue.env},
        timeout=WAIT,
    )
    assert result.returncode == 2
    doc = envelope(result)
    assert doc["data"] is None and doc["errors"] == ["the current directory no longer exists; give --cwd"]


def test_status_names_a_daemon_that_runs_but_listens_elsewhere(queue: QueueBox, tmp_path: Path) -> None:
    queue.start_daemon()
    elsewhere = {"GPUBOX_RUNTIME_DIR": str(tmp_path / "other-run")}
    result = queue("daemon", "status", env=elsewhere)
    assert result.returncode == 4
    pid = queue.daemon_pid()
    assert result.stderr.startswith(f"gpubox: a daemon (pid {pid}) holds {queue.state_dir} but does not answer on ")
    assert result.stderr.endswith("is GPUBOX_RUNTIME_DIR the one it was started with?\n")
