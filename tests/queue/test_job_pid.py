"""`job_pid` in the queue's JSON: the running job's own process, which py-spy, nvidia-smi and
`gpubox top` name, where `pid` is its supervisor's. Real processes through the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from gpubox.queue import proctree
from tests.queue.conftest import QueueBox, wait_until
from tests.queue.test_queue_processes import END_STATES, HANG, hold_until, read_pid, stat_fields


def record(queue: QueueBox, *args: str) -> dict[str, Any]:
    result = queue("queue", *args, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)["data"]
    return data


def test_job_pid_is_the_jobs_own_process_not_its_supervisor_nor_what_it_left(queue: QueueBox, tmp_path: Path) -> None:
    go = tmp_path / "go"
    # Beside the job's shell, two orphans left to its supervisor: one that leads a group of its
    # own in the same session, started later, and one that left the session. Neither is the job.
    script = f"""
cd {tmp_path}
echo $$ > shell.pid
sleep 0.2
(python3 -c 'import os, time; os.setpgid(0, 0); open("leader.pid", "w").write(str(os.getpid())); time.sleep(300)' &)
(setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' &)
{hold_until(go)}
"""
    job_id = queue.add("--gpus", "0", "--shell", "--", script)
    queue.wait_state(job_id, ("running",), timeout=HANG)
    shell, leader, escaped = (read_pid(tmp_path / f"{n}.pid") for n in ("shell", "leader", "escaped"))
    assert stat_fields(escaped)[3] == str(escaped)  # left the session
    assert stat_fields(leader)[2] == str(leader) and stat_fields(leader)[3] == stat_fields(shell)[3]
    supervisor = int(stat_fields(shell)[1])
    wait_until(lambda: int(stat_fields(leader)[1]) == supervisor == int(stat_fields(escaped)[1]), HANG, "the orphans")

    shown = record(queue, "show", str(job_id))["job"]
    assert shown["job_pid"] == shell
    assert shown["pid"] == supervisor != shell
    (listed,) = [j for j in record(queue, "ls")["jobs"] if j["id"] == job_id]
    assert listed["job_pid"] == shell

    go.touch()
    queue.wait_state(job_id, END_STATES, timeout=HANG)
    ended = record(queue, "show", str(job_id))["job"]
    assert ended["job_pid"] is None


def test_job_pid_is_null_for_a_queued_job(queue: QueueBox) -> None:
    assert queue("queue", "pause").returncode == 0
    job_id = queue.add("--gpus", "0", "--", "true")
    assert record(queue, "show", str(job_id))["job"]["job_pid"] is None


def test_job_leader_of_a_process_without_children_is_none() -> None:
    with subprocess.Popen(["sleep", "30"]) as lonely:
        try:
            assert proctree.job_leader(lonely.pid) is None
        finally:
            lonely.kill()
