"""The queue with real processes: the CLI as clients, a real daemon, real supervisors, real
signals and a real SQLite database (read here only to check what was stored).

Nothing here measures speed: jobs that must be running at a given moment wait for a file the
test creates, and every timeout is only a guard against a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox.probe.launch import SITE_DIR
from gpubox.queue import proctree
from gpubox.queue.store import JobStore
from tests.queue.conftest import QueueBox, kill_everything, wait_until

END_STATES = ("succeeded", "failed", "cancelled", "timeout", "lost")
HANG = 60.0  # seconds: only a guard against a hang, never a measure of speed


def hold_until(go: Path) -> str:
    """Shell code that blocks until the test creates `go`."""
    return f"while [ ! -e {go} ]; do sleep 0.05; done"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def read_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip().isdigit(), HANG, f"{path.name}")
    return int(path.read_text().strip())


def stat_fields(pid: int) -> list[str]:
    data = Path(f"/proc/{pid}/stat").read_text()
    return data[data.rfind(")") + 2 :].split()


def attempts(queue: QueueBox, job_id: int) -> list[tuple[Any, ...]]:
    """(number, exit_code, outcome, boot_id, started_at, ended_at) for each attempt, in order."""
    return queue.rows(
        "SELECT number, exit_code, outcome, boot_id, started_at, ended_at FROM attempts"
        f" WHERE job_id = {int(job_id)} ORDER BY number"
    )


def ls_json(queue: QueueBox, *args: str) -> dict[str, Any]:
    result = queue("queue", "ls", "--json", *args)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    data: dict[str, Any] = doc["data"]
    return data


def listed(queue: QueueBox, job_id: int) -> dict[str, Any]:
    (record,) = [j for j in ls_json(queue, "--all")["jobs"] if j["id"] == job_id]
    return record


def start_fresh_daemon(queue: QueueBox) -> subprocess.Popen[bytes]:
    """Start a daemon and wait until it holds the lock (a dead daemon's socket file may linger)."""
    proc = queue.start_daemon()
    wait_until(lambda: queue.daemon_pid() == proc.pid, HANG, "the new daemon to take its lock")
    return proc


def wait_all_ended(queue: QueueBox, count: int, timeout: float) -> None:
    marks = ",".join(f"'{s}'" for s in END_STATES)

    def done() -> bool:
        return queue.rows(f"SELECT count(*) FROM jobs WHERE state IN ({marks})")[0][0] == count

    wait_until(done, timeout, f"{count} jobs to end")


# 1. Many concurrent clients: every job is stored once and runs exactly once


def test_1000_jobs_from_20_concurrent_clients_each_run_exactly_once(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "8"
    ran = tmp_path / "ran"
    job = f"echo $GPUBOX_JOB_ID >> {ran}"
    env = {**os.environ, **queue.env, **queue.extra_env}
    clients: list[subprocess.Popen[str]] = []
    looping, per_client = 3, 50
    for n in range(20):
        if n < looping:  # `queue add` 50 times in a row
            argv = [
                "/bin/sh",
                "-c",
                'i=0; while [ $i -lt 50 ]; do "$0" -m gpubox queue add --gpus 0 --shell -- "$1" || exit 1;'
                " i=$((i + 1)); done",
                sys.executable,
                job,
            ]
        else:  # one `queue add --file` with 50 lines
            jobs_file = tmp_path / f"jobs-{n}.txt"
            jobs_file.write_text("".join(f"{job}\n" for _ in range(per_client)))
            argv = [sys.executable, "-m", "gpubox", "queue", "add", "--gpus", "0", "--shell", "--file", str(jobs_file)]
        clients.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
            )
        )
    ids: list[int] = []
    for client in clients:
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        got = [int(line) for line in out.split()]
        assert len(got) == per_client
        ids.extend(got)

    assert len(ids) == 1000
    assert len(set(ids)) == 1000
    wait_all_ended(queue, 1000, timeout=120)

    states = dict(queue.rows("SELECT state, count(*) FROM jobs GROUP BY state"))
    assert states == {"succeeded": 1000}
    assert {row[0] for row in queue.rows("SELECT id FROM jobs")} == set(ids)
    per_job = queue.rows("SELECT job_id, count(*), min(number), max(number) FROM attempts GROUP BY job_id")
    assert len(per_job) == 1000
    assert {(count, first, last) for _, count, first, last in per_job} == {(1, 1, 1)}
    assert queue.rows("SELECT count(*) FROM attempts WHERE outcome = 'succeeded' AND exit_code = 0") == [(1000,)]
    # Beyond the database: each job's process appended its own id, once.
    assert Counter(int(x) for x in lines(ran)) == Counter(ids)


# 2. A daemon killed while jobs run: the jobs go on, and their own exit codes are recorded once


def test_daemon_sigkill_while_jobs_run_records_each_exit_code_once(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "3"
    daemon = queue.start_daemon()
    starts = tmp_path / "starts"
    ids: dict[int, int] = {}
    for code in (0, 3, 7):
        script = f"echo $GPUBOX_JOB_ID >> {starts}; {hold_until(tmp_path / f'go{code}')}; exit {code}"
        ids[code] = queue.add("--gpus", "0", "--shell", "--", script)
    for job_id in ids.values():
        queue.wait_state(job_id, ("running",), timeout=HANG)
    wait_until(lambda: len(lines(starts)) == 3, HANG, "the three jobs to start")
    supervisors = {code: (queue.job(i)["pid"], queue.job(i)["pid_start"]) for code, i in ids.items()}

    daemon.kill()  # SIGKILL: no chance to clean up
    daemon.wait(timeout=HANG)
    assert queue.daemon_pid() is None
    for pid, ticks in supervisors.values():
        assert proctree.is_alive(pid, ticks), "a supervisor died with the daemon"

    # One job ends while no daemon runs: its supervisor leaves the outcome for the next daemon.
    (tmp_path / "go3").touch()
    wait_until(lambda: (queue.state_dir / "logs" / f"{ids[3]}.1.exit").exists(), HANG, "the exit record")
    assert queue.job(ids[3])["state"] == "running"  # nobody has recorded it yet

    start_fresh_daemon(queue)
    row = queue.wait_state(ids[3], END_STATES, timeout=HANG)
    assert (row["state"], row["exit_code"]) == ("failed", 3)
    # The two others were running all along, under their first supervisors: not restarted.
    for code in (0, 7):
        assert queue.job(ids[code])["state"] == "running"
        assert (queue.job(ids[code])["pid"], queue.job(ids[code])["pid_start"]) == supervisors[code]
        assert proctree.is_alive(*supervisors[code])
        (tmp_path / f"go{code}").touch()
    for code, job_id in ids.items():
        row = queue.wait_state(job_id, END_STATES, timeout=HANG)
        assert row["exit_code"] == code
        assert row["state"] == ("succeeded" if code == 0 else "failed")
        assert row["attempt"] == 1
        assert [(a[0], a[1], a[2]) for a in attempts(queue, job_id)] == [(1, code, row["state"])]
    assert Counter(int(x) for x in lines(starts)) == Counter(ids.values())


# 3. A reboot: what ran is lost, what waited runs


def test_reboot_marks_running_jobs_lost_and_runs_queued_ones(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "2"
    queue.extra_env["GPUBOX_BOOT_ID"] = "boot-A"
    daemon = queue.start_daemon()
    starts = tmp_path / "starts"
    running = [queue.add("--gpus", "0", "--shell", "--", f"echo $GPUBOX_JOB_ID >> {starts}; sleep 300") for _ in "ab"]
    after = tmp_path / "after-reboot"
    waiting = queue.add("--gpus", "0", "--shell", "--", f"echo $GPUBOX_JOB_ID >> {after}")
    for job_id in running:
        queue.wait_state(job_id, ("running",), timeout=HANG)
    wait_until(lambda: len(lines(starts)) == 2, HANG, "the two jobs to start")
    assert queue.job(waiting)["state"] == "queued"

    # The power goes: nothing is left to record anything. The daemon goes first, so that it
    # cannot see its supervisors die; then the supervisors and the jobs.
    supervisors = {queue.job(i)["pid"] for i in running}
    doomed = supervisors | {p for root in supervisors for p in proctree.descendants(root)}
    daemon.kill()
    daemon.wait(timeout=HANG)
    kill_everything(queue)
    wait_until(lambda: not any(p and proctree.is_alive(p, None) for p in doomed), HANG, "everything to die")

    queue.extra_env["GPUBOX_BOOT_ID"] = "boot-B"
    start_fresh_daemon(queue)
    for job_id in running:
        row = queue.wait_state(job_id, END_STATES, timeout=HANG)
        assert row["state"] == "lost"
        assert "restart" in row["reason"]
        ((number, code, outcome, boot, _, ended),) = attempts(queue, job_id)
        assert (number, code, outcome, boot) == (1, None, "lost", "boot-A")
        assert ended is not None
    row = queue.wait_state(waiting, END_STATES, timeout=HANG)
    assert (row["state"], row["exit_code"]) == ("succeeded", 0)
    assert [(a[0], a[2], a[3]) for a in attempts(queue, waiting)] == [(1, "succeeded", "boot-B")]
    assert lines(after) == [str(waiting)]
    assert Counter(int(x) for x in lines(starts)) == Counter(running)  # the lost ones were not run again
    assert queue("queue", "wait", str(running[0]), timeout=HANG).returncode == 1


# 4. Cancel stops the whole tree, escaped and stubborn processes included


def test_cancel_stops_the_whole_process_tree(queue: QueueBox, tmp_path: Path) -> None:
    script = f"""
cd {tmp_path}
echo $$ > shell.pid
sh -c 'sleep 300 & echo $! > grandchild.pid; wait' &
echo $! > child.pid
setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' &
(sleep 300 & echo $! > orphan.pid) &
sh -c 'trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done' &
wait
"""
    job_id = queue.add("--gpus", "0", "--shell", "--", script)
    queue.wait_state(job_id, ("running",), timeout=HANG)
    names = ("shell", "child", "grandchild", "escaped", "orphan", "stubborn")
    pids = {name: read_pid(tmp_path / f"{name}.pid") for name in names}
    ticks = {name: proctree.start_ticks(pid) for name, pid in pids.items()}
    assert all(t is not None for t in ticks.values()), ticks
    # The escaped one really left the job's process group and session.
    shell_pgrp = stat_fields(pids["shell"])[2]
    escaped = stat_fields(pids["escaped"])
    assert escaped[2] != shell_pgrp and escaped[3] == str(pids["escaped"])

    result = queue("queue", "cancel", str(job_id))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"job {job_id}: stopping"
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert row["state"] == "cancelled"
    assert row["exit_code"] == 128 + signal.SIGTERM  # the job's shell died of the SIGTERM
    assert "cancel" in row["reason"]
    # None survives; the stubborn child ignores SIGTERM (so do its own children), so only the
    # SIGKILL after the grace can have ended it.
    survivors = [name for name, pid in pids.items() if proctree.is_alive(pid, ticks[name])]
    assert survivors == []
    assert [(a[0], a[2]) for a in attempts(queue, job_id)] == [(1, "cancelled")]


def test_cancel_sigkills_a_job_that_ignores_sigterm_after_the_grace(queue: QueueBox, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.1; done"
    job_id = queue.add("--gpus", "0", "--shell", "--", script)
    queue.wait_state(job_id, ("running",), timeout=HANG)
    pid = read_pid(pid_file)
    ticks = proctree.start_ticks(pid)

    assert queue("queue", "cancel", str(job_id)).returncode == 0
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert row["state"] == "cancelled"
    assert row["exit_code"] == 128 + signal.SIGKILL
    assert not proctree.is_alive(pid, ticks)


# 5. Time limit


def test_time_limit_stops_the_job_as_timeout(queue: QueueBox) -> None:
    job_id = queue.add("--gpus", "0", "--time-limit", "1s", "--", "sleep", "60")
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert row["state"] == "timeout"
    assert row["exit_code"] in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert "time limit" in row["reason"]
    assert [(a[0], a[1], a[2]) for a in attempts(queue, job_id)] == [(1, row["exit_code"], "timeout")]
    waited = queue("queue", "wait", str(job_id), timeout=HANG)
    assert waited.returncode == row["exit_code"]
    assert "time limit" in queue("queue", "logs", "--stderr", str(job_id)).stdout


# 6. Retries


def test_retries_run_again_until_success_with_a_log_per_attempt(queue: QueueBox, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    script = (
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {counter};"
        ' echo "out $n of $GPUBOX_JOB_ATTEMPT"; echo "err $n" >&2; [ $n -ge 3 ]'
    )
    job_id = queue.add("--gpus", "0", "--retries", "2", "--shell", "--", script)
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert (row["state"], row["exit_code"], row["attempt"]) == ("succeeded", 0, 3)
    tries = attempts(queue, job_id)
    assert [a[0] for a in tries] == [1, 2, 3]
    assert [a[1] for a in tries] == [1, 1, 0]
    assert [a[2] for a in tries] == ["failed", "failed", "succeeded"]
    for n in (1, 2, 3):
        out = queue("queue", "logs", str(job_id), "--attempt", str(n))
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"out {n} of {n}\n"
        err = queue("queue", "logs", str(job_id), "--attempt", str(n), "--stderr")
        assert err.stdout == f"err {n}\n"
    assert queue("queue", "logs", str(job_id)).stdout == "out 3 of 3\n"  # the latest attempt


def test_retries_run_out_and_the_job_fails(queue: QueueBox) -> None:
    job_id = queue.add("--gpus", "0", "--retries", "1", "--shell", "--", "exit 5")
    row = queue.wait_state(job_id, END_STATES, timeout=HANG)
    assert (row["state"], row["exit_code"], row["attempt"]) == ("failed", 5, 2)
    assert [(a[0], a[1], a[2]) for a in attempts(queue, job_id)] == [(1, 5, "failed"), (2, 5, "failed")]


# 7. Dependencies


def test_after_runs_only_once_the_dependency_succeeded(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "4"
    queue.start_daemon()
    a = queue.add("--gpus", "0", "--shell", "--", hold_until(tmp_path / "go"))
    b = queue.add("--gpus", "0", "--after", str(a), "--", "true")
    queue.wait_state(a, ("running",), timeout=HANG)
    wait_until(lambda: f"job {a}" in (listed(queue, b)["reason"] or ""), HANG, "B to say it waits for A")
    assert queue.job(b)["state"] == "queued"
    assert attempts(queue, b) == []

    (tmp_path / "go").touch()
    row_b = queue.wait_state(b, END_STATES, timeout=HANG)
    row_a = queue.job(a)
    assert row_a["state"] == "succeeded"
    assert row_b["state"] == "succeeded"
    assert row_b["started_at"] >= row_a["ended_at"]
    assert len(attempts(queue, b)) == 1


def test_a_failed_dependency_fails_its_chain_without_running_it(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "4"
    queue.start_daemon()
    x = queue.add("--gpus", "0", "--shell", "--", "exit 3")
    c = queue.add("--gpus", "0", "--after", str(x), "--shell", "--", f"touch {tmp_path / 'c-ran'}")
    d = queue.add("--gpus", "0", "--after", str(c), "--shell", "--", f"touch {tmp_path / 'd-ran'}")
    assert queue.wait_state(x, END_STATES, timeout=HANG)["state"] == "failed"
    row_c = queue.wait_state(c, END_STATES, timeout=HANG)
    row_d = queue.wait_state(d, END_STATES, timeout=HANG)
    assert row_c["state"] == "failed" and f"job {x}" in row_c["reason"]
    assert row_d["state"] == "failed" and f"job {c}" in row_d["reason"]
    for job_id in (c, d):
        assert attempts(queue, job_id) == []
        assert queue.job(job_id)["attempt"] == 0
    assert not (tmp_path / "c-ran").exists()
    assert not (tmp_path / "d-ran").exists()


# 8. Pause and resume


def test_pause_holds_new_jobs_and_keeps_running_ones(queue: QueueBox, tmp_path: Path) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "2"
    queue.start_daemon()
    running = queue.add("--gpus", "0", "--shell", "--", hold_until(tmp_path / "go"))
    queue.wait_state(running, ("running",), timeout=HANG)
    supervisor = (queue.job(running)["pid"], queue.job(running)["pid_start"])

    paused = queue("queue", "pause")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == "the queue: paused"
    marker = tmp_path / "held-ran"
    held = queue.add("--gpus", "0", "--shell", "--", f"touch {marker}")
    wait_until(lambda: "paused" in (listed(queue, held)["reason"] or ""), HANG, "the paused reason")
    assert queue.job(held)["state"] == "queued"
    assert not marker.exists()
    assert attempts(queue, held) == []
    # The running job is untouched by the pause, and ends (and is recorded) while paused.
    assert queue.job(running)["state"] == "running"
    assert proctree.is_alive(*supervisor)
    (tmp_path / "go").touch()
    assert queue.wait_state(running, END_STATES, timeout=HANG)["state"] == "succeeded"
    assert queue.job(held)["state"] == "queued"

    resumed = queue("queue", "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "the queue: resumed"
    assert queue.wait_state(held, END_STATES, timeout=HANG)["state"] == "succeeded"
    assert marker.exists()


# 9. What `queue wait` exits with


def test_wait_exits_with_the_jobs_own_code(queue: QueueBox) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "4"
    queue.start_daemon()
    failing = queue.add("--gpus", "0", "--shell", "--", "exit 42")
    fine = [queue.add("--gpus", "0", "--", "true") for _ in range(3)]

    one = queue("queue", "wait", str(failing), timeout=HANG)
    assert one.returncode == 42, one.stderr
    assert one.stdout.strip() == f"job {failing}: failed (exit 42)"
    all_fine = queue("queue", "wait", *map(str, fine), timeout=HANG)
    assert all_fine.returncode == 0, all_fine.stderr
    assert all_fine.stdout.splitlines() == [f"job {i}: succeeded (exit 0)" for i in fine]
    mixed = queue("queue", "wait", str(fine[0]), str(failing), timeout=HANG)
    assert mixed.returncode == 42


def test_wait_timeout_exits_124_with_one_line(queue: QueueBox) -> None:
    job_id = queue.add("--gpus", "0", "--", "sleep", "300")
    queue.wait_state(job_id, ("running",), timeout=HANG)
    result = queue("queue", "wait", "--timeout", "1s", str(job_id), timeout=HANG)
    assert result.returncode == 124
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert str(job_id) in result.stderr
    assert result.stdout == ""
    assert queue.job(job_id)["state"] == "running"  # giving up waiting does not touch the job


# 10. Following logs


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One line from a child's stdout, or fail after `timeout` (a hang guard)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no full line within {timeout}s: {data!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            assert chunk, f"the output ended early: {data!r}"
            data += chunk
    return data


@contextlib.contextmanager
def following(queue: QueueBox, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`queue logs -f ARGS` in the background, killed at the end if it is still running."""
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "queue", "logs", "-f", *args],
        env={**os.environ, **queue.env, **queue.extra_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield follower
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


RETRIED = (
    "echo att $GPUBOX_JOB_ATTEMPT start; while [ ! -e {go}.$GPUBOX_JOB_ATTEMPT ]; do sleep 0.02; done;"
    " echo att $GPUBOX_JOB_ATTEMPT end; exit 6"
)


def test_logs_follow_reads_the_end_of_an_attempt_before_the_next_ones_log(queue: QueueBox, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job_id = queue.add("--gpus", "0", "--retries", "1", "--shell", "--", RETRIED.format(go=go))
    with following(queue, str(job_id)) as follower:
        assert read_line(follower, HANG) == b"att 1 start\n"
        # The attempt ends and the retry starts while the follower waits between two reads.
        (tmp_path / "go.1").touch()
        wait_until(lambda: queue.job(job_id)["attempt"] == 2, HANG, "the retry to start")
        (tmp_path / "go.2").touch()
        rest, err = follower.communicate(timeout=HANG)
    assert rest.decode() == "att 1 end\natt 2 start\natt 2 end\n", err


def test_logs_follow_of_one_attempt_ends_with_it_and_a_job_that_never_ran_says_so(
    queue: QueueBox, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job_id = queue.add("--gpus", "0", "--retries", "1", "--shell", "--", RETRIED.format(go=go))
    queue.wait_state(job_id, ("running",), HANG)
    with following(queue, "--attempt", "1", str(job_id)) as follower:
        assert read_line(follower, HANG) == b"att 1 start\n"
        (tmp_path / "go.1").touch()
        rest, err = follower.communicate(timeout=HANG)  # attempt 2 runs on, held
    assert (follower.returncode, rest) == (0, b"att 1 end\n"), err
    assert queue.job(job_id)["state"] in ("queued", "running")  # the retry, not over
    (tmp_path / "go.2").touch()
    queue.wait_state(job_id, ("failed",), HANG)
    dependant = queue.add("--gpus", "0", "--after", str(job_id), "--", "true")
    queue.wait_state(dependant, ("failed",), HANG)
    for follow in ((), ("-f",)):
        shown = queue("queue", "logs", *follow, str(dependant))
        assert (shown.returncode, shown.stderr) == (1, f"gpubox: job {dependant} never ran (failed): no log\n")


def test_logs_follow_streams_until_the_job_ends(queue: QueueBox, tmp_path: Path) -> None:
    script = (
        f"echo first; {hold_until(tmp_path / 'go')};"
        " for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; echo oops >&2; echo last"
    )
    job_id = queue.add("--gpus", "0", "--shell", "--", script)
    with following(queue, str(job_id)) as follower:
        # The first line arrives while the job still runs: it is streamed, not read at the end.
        assert read_line(follower, HANG) == b"first\n"
        assert queue.job(job_id)["state"] == "running"
        assert follower.poll() is None
        (tmp_path / "go").touch()
        rest, err = follower.communicate(timeout=HANG)
    assert follower.returncode == 0, err
    assert rest.decode() == "".join(f"line {i}\n" for i in range(1, 6)) + "last\n"
    assert queue.job(job_id)["state"] == "succeeded"
    assert queue("queue", "logs", "--stderr", str(job_id)).stdout == "oops\n"
    assert queue("queue", "logs", str(job_id)).stdout == "first\n" + rest.decode()


# 11. Privacy of the database, the logs and the socket


def test_database_logs_and_socket_are_private(queue: QueueBox) -> None:
    old = os.umask(0o022)  # a usual umask: files would be world-readable unless made private
    try:
        job_id = queue.add("--gpus", "0", "--shell", "--", "echo secret; echo secret >&2")
        queue.wait_state(job_id, END_STATES, timeout=HANG)
    finally:
        os.umask(old)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(queue.state_dir) == 0o700
    assert mode(queue.runtime_dir) == 0o700
    assert mode(queue.db) == 0o600
    for side in ("-wal", "-shm"):
        path = Path(f"{queue.db}{side}")
        if path.exists():
            assert mode(path) == 0o600, path
    sock = queue.socket
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert mode(sock) == 0o600
    job_logs = queue.state_dir / "logs"
    files = {p.name: mode(p) for p in job_logs.glob(f"{job_id}.*")}
    # The daemon recorded the end, so the supervisor left no exit record (see the next test for one).
    assert files == {f"{job_id}.1.out": 0o600, f"{job_id}.1.err": 0o600}
    assert oct(mode(queue.state_dir / "logs")) == oct(0o700), "the directory of all logs is not private"


# 12. The daemon's status and stop


def test_daemon_status_and_stop_leave_running_jobs_alone(queue: QueueBox, tmp_path: Path) -> None:
    down = queue("daemon", "status")
    assert down.returncode == 4
    assert queue.daemon_pid() is None  # asking the status does not start one

    queue.start_daemon()
    pid = queue.daemon_pid()
    assert pid is not None and pid > 0
    up = queue("daemon", "status")
    assert up.returncode == 0, up.stderr
    assert f"pid {pid}," in up.stdout

    job_id = queue.add("--gpus", "0", "--shell", "--", f"{hold_until(tmp_path / 'go')}; exit 9")
    queue.wait_state(job_id, ("running",), timeout=HANG)
    supervisor = (queue.job(job_id)["pid"], queue.job(job_id)["pid_start"])

    stopped = queue("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"pid {pid}" in stopped.stdout
    assert queue.daemon_pid() is None
    assert not proctree.is_alive(pid, None)
    assert queue("daemon", "status").returncode == 4
    assert queue("daemon", "stop").returncode == 0  # stopping a stopped daemon is fine
    # The job goes on without a daemon, and ends without one.
    assert proctree.is_alive(*supervisor)
    assert queue.job(job_id)["state"] == "running"
    (tmp_path / "go").touch()
    exit_record = queue.state_dir / "logs" / f"{job_id}.1.exit"
    wait_until(exit_record.exists, HANG, "the exit record")
    assert queue.job(job_id)["state"] == "running"
    assert stat.S_IMODE(exit_record.stat().st_mode) == 0o600

    # The next client starts a daemon, which records the exit code.
    waited = queue("queue", "wait", str(job_id), timeout=HANG)
    assert waited.returncode == 9, waited.stderr
    row = queue.job(job_id)
    assert (row["state"], row["exit_code"], row["attempt"]) == ("failed", 9, 1)
    assert queue.daemon_pid() not in (None, pid)


def test_daemon_status_json_says_whether_it_runs(queue: QueueBox) -> None:
    down = queue("daemon", "status", "--json")
    assert down.returncode == 4
    assert json.loads(down.stdout)["data"] == {"running": False}
    queue.start_daemon()
    up = queue("daemon", "status", "--json")
    assert up.returncode == 0, up.stderr
    data = json.loads(up.stdout)["data"]
    assert data["pid"] == queue.daemon_pid()
    assert data["running"] is True  # whether the daemon runs, not how many jobs do


# 13. The job's environment


def parse_env(data: bytes) -> dict[str, str]:
    pairs = (item.decode().partition("=") for item in data.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def test_job_environment(queue: QueueBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "2"
    queue.start_daemon()
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # the submitter's working directory, which the job must get
    submitter = {"FOO": "bar", "OVERRIDDEN": "old", "PYTHONPATH": "/opt/mine"}
    dump = "env -0 > {out}.env; pwd -P > {out}.cwd"
    probed = queue.add(
        "--gpus", "0", "--kind", "batch", "--env", "EXTRA=x=y", "--env", "OVERRIDDEN=new",
        "--shell", "--", dump.format(out=tmp_path / "probed"),
        env=submitter,
    )  # fmt: skip
    plain = queue.add("--gpus", "0", "--no-probe", "--shell", "--", dump.format(out=tmp_path / "plain"), env=submitter)
    for job_id in (probed, plain):
        assert queue.wait_state(job_id, END_STATES, timeout=HANG)["state"] == "succeeded"

    env = parse_env((tmp_path / "probed.env").read_bytes())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUBOX_JOB_ID"] == str(probed)
    assert env["GPUBOX_JOB_KIND"] == "batch"
    assert env["GPUBOX_JOB_ATTEMPT"] == "1"
    assert env["FOO"] == "bar"
    assert env["EXTRA"] == "x=y"
    assert env["OVERRIDDEN"] == "new"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), "/opt/mine"]
    assert (tmp_path / "probed.cwd").read_text().strip() == str(workdir.resolve())

    env = parse_env((tmp_path / "plain.env").read_bytes())
    assert env["PYTHONPATH"] == "/opt/mine"
    assert env["GPUBOX_JOB_KIND"] == "other"
    assert env["GPUBOX_JOB_ID"] == str(plain)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["OVERRIDDEN"] == "old"
    assert (tmp_path / "plain.cwd").read_text().strip() == str(workdir.resolve())


def test_a_job_without_the_probe_gets_none_from_the_environment_it_was_added_in() -> None:
    """Added from inside a probed job (or `gpubox run`), the captured PYTHONPATH carries the
    probe's sitecustomize: --no-probe takes it off, and leaves the user's own entries."""
    from gpubox.queue.jobs import JobSpec
    from gpubox.queue.supervise import job_environment

    site = str(SITE_DIR)
    inherited = {"PYTHONPATH": os.pathsep.join([site, "/opt/mine"])}
    env = job_environment(JobSpec(argv=("x",), env=inherited, probe=False), 7, 1, ())
    assert env["PYTHONPATH"] == "/opt/mine"
    env = job_environment(JobSpec(argv=("x",), env={"PYTHONPATH": site}, probe=False), 7, 1, ())
    assert "PYTHONPATH" not in env  # not "": that would put the working directory on sys.path
    env = job_environment(JobSpec(argv=("x",), env={"PYTHONPATH": "/opt/mine"}, probe=False), 7, 1, ())
    assert env["PYTHONPATH"] == "/opt/mine"
    env = job_environment(JobSpec(argv=("x",), env=inherited, probe=True), 7, 1, ())
    assert env["PYTHONPATH"].split(os.pathsep) == [site, "/opt/mine"]  # once, as before


# 14. Supervisors run later jobs, but none after a stop


def add_file(queue: QueueBox, jobs: Path) -> list[int]:
    result = queue("queue", "add", "--gpus", "0", "--shell", "--file", str(jobs))
    assert result.returncode == 0, result.stderr
    return [int(x) for x in result.stdout.split()]


def test_supervisors_run_later_jobs_but_never_after_their_job_was_stopped(queue: QueueBox, tmp_path: Path) -> None:
    queue.start_daemon()
    parents = tmp_path / "parents"
    jobs = tmp_path / "jobs.txt"
    # Supervisors are kept while jobs wait: submitted together, the jobs share them.
    jobs.write_text(f'echo "$GPUBOX_JOB_ID $PPID" >> {parents}\n' * 8)
    batch = add_file(queue, jobs)
    for job_id in batch:
        assert queue.wait_state(job_id, END_STATES, timeout=HANG)["state"] == "succeeded"
    recorded = {job_id: queue.job(job_id)["pid"] for job_id in batch}
    # Each job ran under the supervisor recorded for it, and supervisors ran several jobs each.
    assert {int(a): int(b) for a, b in (line.split() for line in lines(parents))} == recorded
    assert len(set(recorded.values())) < len(batch)
    assert not list((queue.state_dir / "logs").glob("*.exit"))  # every end recorded by the daemon

    jobs.write_text("sleep 0.05\n" * 6)
    for how in ("queue cancel", "kill", "late"):
        go = tmp_path / f"go-{how.replace(' ', '-')}"
        job_id = queue.add("--gpus", "0", "--shell", "--", hold_until(go))
        row = queue.wait_state(job_id, ("running",), timeout=HANG)
        later = add_file(queue, jobs)  # waiting for the one CPU-only slot when the job is stopped
        if how == "kill":  # someone signals the supervisor itself: it stops the job all the same
            os.kill(row["pid"], signal.SIGTERM)
        elif how == "queue cancel":
            ok = queue("queue", "cancel", str(job_id))
            assert ok.returncode == 0, ok.stderr
        else:
            # A cancel whose signal is still on its way when the job ends by itself: the client
            # has committed its request (as `queue cancel` does first) and not yet signalled.
            store = JobStore(queue.db)
            try:
                store.request_stop(job_id, "cancel")
            finally:
                store.close()
            go.touch()
        assert queue.wait_state(job_id, END_STATES, timeout=HANG)["state"] == "cancelled"
        if how == "late":
            # Its supervisor may have gone on to a job handed on (its job ended by itself before
            # the daemon saw the request): the late signal must stop none of them.
            with contextlib.suppress(ProcessLookupError):
                if proctree.is_alive(row["pid"], row["pid_start"]):
                    os.kill(row["pid"], signal.SIGTERM)
        for later_id in later:
            assert queue.wait_state(later_id, END_STATES, timeout=HANG)["state"] == "succeeded"
            assert queue.job(later_id)["attempt"] == 1  # none stopped before it ran, none twice
        if how != "late":
            # A supervisor that was signalled runs no other job: the daemon keeps none.
            assert row["pid"] not in {queue.job(later_id)["pid"] for later_id in later}
        pid, ticks = row["pid"], row["pid_start"]
        wait_until(lambda: not proctree.is_alive(pid, ticks), HANG, "its supervisor to exit")  # noqa: B023
    # Nothing waits now: no supervisor is kept idle.
    kept = {(r["pid"], r["pid_start"]) for r in (queue.job(i) for i in (*batch, *later))}
    wait_until(lambda: not any(proctree.is_alive(*k) for k in kept), HANG, "the idle supervisors to exit")
