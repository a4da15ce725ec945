"""The queue examples in examples/ do what their comments say, run as a user or cron would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO
from tests.queue.conftest import QueueBox


def _env(queue: QueueBox, **extra: str) -> dict[str, str]:
    env = {**os.environ, **queue.env, "GPUBOX": str(Path(sys.executable).parent / "gpubox")}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    env.update(extra)
    return env


def test_nightly_eval_cron_queues_one_job_that_runs_in_the_project(queue: QueueBox, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = _env(queue, EVAL_PROJECT=str(project), EVAL_CMD="pwd > where; echo evaluated", EVAL_TEAM="nlp")
    env["PATH"] = "/usr/bin:/bin"  # cron's; the script finds gpubox through $GPUBOX
    result = subprocess.run(
        [str(REPO / "examples/cron/nightly-eval.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout.strip())
    assert queue("queue", "wait", str(job_id)).returncode == 0
    assert (project / "where").read_text().strip() == str(project)
    shown = json.loads(queue("queue", "show", str(job_id), "--json").stdout)["data"]["job"]
    assert shown["kind"] == "infer"
    assert shown["tags"] == {"team": "nlp"}
    assert shown["time_limit_s"] == 3 * 3600
    assert shown["name"].startswith("nightly-eval-")
    assert os.access(REPO / "examples/cron/nightly-eval.sh", os.X_OK)


def test_nightly_eval_jobs_find_their_tool_on_eval_path_under_crons_path(queue: QueueBox, tmp_path: Path) -> None:
    """The job keeps the environment it was queued with, cron's short PATH: EVAL_PATH adds the
    folder of what runs the eval (a venv's bin)."""
    project, tools = tmp_path / "project", tmp_path / "venv-bin"
    project.mkdir()
    tools.mkdir()
    tool = tools / "run-eval"
    tool.write_text("#!/bin/sh\necho evaluated > result\n")
    tool.chmod(0o755)
    env = _env(queue, EVAL_PROJECT=str(project), EVAL_CMD="run-eval", EVAL_PATH=str(tools))
    env["PATH"] = "/usr/bin:/bin"
    result = subprocess.run(
        [str(REPO / "examples/cron/nightly-eval.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert queue("queue", "wait", result.stdout.strip()).returncode == 0
    assert (project / "result").read_text() == "evaluated\n"


def test_quantize_runs_after_training_succeeds(queue: QueueBox, tmp_path: Path) -> None:
    env = _env(queue, TRAIN_CMD=f"echo trained > {tmp_path}/ckpt", QUANT_CMD=f"cat {tmp_path}/ckpt > {tmp_path}/q")
    result = subprocess.run(
        [str(REPO / "examples/queue/train-then-quantize.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "q").read_text() == "trained\n"
    rows = queue.rows("SELECT name, state, started_at, ended_at FROM jobs ORDER BY id")
    (train, quant) = rows
    assert (train[0], train[1], quant[0], quant[1]) == ("train", "succeeded", "quantize", "succeeded")
    assert quant[2] >= train[3], "quantize started before training ended"


def test_quantize_fails_with_the_reason_when_training_fails(queue: QueueBox, tmp_path: Path) -> None:
    env = _env(queue, TRAIN_CMD="exit 3", QUANT_CMD=f"touch {tmp_path}/quantized")
    result = subprocess.run(
        [str(REPO / "examples/queue/train-then-quantize.sh")], env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 3  # the training's own exit code, after its one retry
    (train, quant) = queue.rows("SELECT state, attempt, reason FROM jobs ORDER BY id")
    assert train[:2] == ("failed", 2)
    assert quant[0] == "failed" and quant[1] == 0
    assert "ended failed" in quant[2]
    assert not (tmp_path / "quantized").exists()


def test_systemd_units_run_the_daemon_and_leave_jobs_running() -> None:
    for name in ("gpubox-daemon.service", "gpubox-daemon-system.service"):
        text = (REPO / "examples/systemd" / name).read_text()
        lines = {
            line.split("=", 1)[0]: line.split("=", 1)[1]
            for line in text.splitlines()
            if "=" in line and not line.startswith("#")
        }
        assert lines["ExecStart"].endswith("gpubox daemon")
        assert lines["ExecStop"].endswith("gpubox daemon stop")
        # Stopping the unit must not kill the jobs in its cgroup: they outlive the daemon.
        assert lines["KillMode"] == "process"
        assert lines["Type"] == "simple"
        # A daemon a client started first gives way (a second one would exit, failing the unit).
        assert lines["ExecStartPre"].startswith("-") and lines["ExecStartPre"].endswith("gpubox daemon stop")
