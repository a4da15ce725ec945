"""Ctrl-C (SIGINT) on the queue's commands that wait, `queue logs -f` and `queue wait`, and on
the plain `queue add` (no Typer): ended by SIGINT (a shell shows 130) and nothing on stderr, when the command starts as
much as while it waits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpubox.exit_codes import ExitCode
from tests.helpers import KILLED_BY_SIGINT, MOMENTS, interrupted
from tests.queue.conftest import QueueBox


def running_job(queue: QueueBox) -> int:
    job_id = queue.add("--gpus", "0", "--shell", "--", "echo started; sleep 600")
    queue.wait_state(job_id, ("running",))
    return job_id


@pytest.fixture
def job(queue: QueueBox) -> Iterator[int]:
    job_id = running_job(queue)
    yield job_id
    queue("queue", "cancel", str(job_id))
    queue("daemon", "stop")


def test_ctrl_c_while_logs_follows(queue: QueueBox, job: int) -> None:
    code, stderr = interrupted(["queue", "logs", "-f", str(job)], env=queue.env, after_output=True)
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


def test_ctrl_c_while_wait_waits(queue: QueueBox, job: int) -> None:
    code, stderr = interrupted(["queue", "wait", str(job)], env=queue.env, after_s=1.5)
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


# A plain `queue wait` runs without Typer (gpubox/cli/queue_wait_fast.py): its own moments; with
# `--` before the id it goes through Typer.
WAIT_MOMENTS = ("gpubox.cli.main", "gpubox.cli.queue_wait_fast", "gpubox.queue.client")


@pytest.mark.parametrize(
    ("command", "moment"),
    [*(("logs -f", m) for m in MOMENTS), *(("wait", m) for m in WAIT_MOMENTS), ("wait --", MOMENTS[1])],
)
def test_ctrl_c_while_logs_or_wait_starts(queue: QueueBox, job: int, command: str, moment: str) -> None:
    code, stderr = interrupted(["queue", *command.split(), str(job)], env=queue.env, after_module=moment)
    assert "Traceback" not in stderr, stderr
    assert (code, stderr) == (KILLED_BY_SIGINT, "")


@pytest.mark.parametrize("moment", ["gpubox.cli.main", "gpubox.cli.plain", "gpubox.cli.queue_add_fast"])
def test_ctrl_c_while_a_plain_queue_add_starts(queue: QueueBox, moment: str) -> None:
    """The plain `queue add` ends soon after it starts: the Ctrl-C ends it, or comes too late to
    (the job is stored, exit 0); never a traceback."""
    try:
        code, stderr = interrupted(["queue", "add", "--gpus", "0", "--", "true"], env=queue.env, after_module=moment)
        assert stderr == "" and code in (KILLED_BY_SIGINT, ExitCode.OK), (code, stderr)
    finally:
        queue("daemon", "stop")
