"""The fast path of `gpubox queue add` (no Typer) knows exactly the options Typer's command has,
stores exactly what Typer's path stores, and leaves everything unusual to Typer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from gpubox.cli import queue as queue_cli
from gpubox.cli.queue_add_fast import FLAGS, MANY, TEXT, WHOLE, parse
from tests.queue.conftest import QueueBox


def test_the_fast_option_table_is_typers() -> None:
    command = typer.main.get_command(queue_cli.app).commands["add"]  # type: ignore[attr-defined]
    typer_options = {opt for p in command.params for opt in p.opts if opt.startswith("--")} - {"--help"}
    assert typer_options == set(TEXT) | set(WHOLE) | set(MANY) | set(FLAGS)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["-h"],
        ["--bogus", "--", "true"],
        ["--gpus", "abc", "--", "true"],
        ["--gpus", "-1", "--", "true"],
        ["--name"],
        ["--file", "-"],
        ["--shell=yes", "--", "true"],
    ],
)
def test_unusual_command_lines_go_to_typer(args: list[str]) -> None:
    assert parse(args) is None


def test_plain_command_lines_are_parsed() -> None:
    assert parse(["--gpus", "2", "--tag=a=b", "--tag", "c=d", "--json", "python", "x.py", "--lr", "3"]) == (
        ["python", "x.py", "--lr", "3"],
        {"tag": ["a=b", "c=d"], "env": [], "gpu": [], "after": [], "gpus": 2, "as_json": True},
    )
    none: dict[str, list[str]] = {"tag": [], "env": [], "gpu": [], "after": []}
    assert parse(["--wait", "--file", "jobs.txt"]) == ([], {**none, "wait": True, "file": "jobs.txt"})
    assert parse(["--name", "n", "--", "--weird-command"]) == (["--weird-command"], {**none, "name": "n"})
    # List options given twice add up (as Typer's path joins them).
    assert parse(["--gpu", "0", "--gpu=2", "--after", "4,5", "--after", "7", "true"]) == (
        ["true"],
        {**none, "gpu": ["0", "2"], "after": ["4,5", "7"]},
    )


def _stored(queue: QueueBox, job_id: int) -> dict[str, object]:
    job = json.loads(queue("queue", "show", str(job_id), "--json").stdout)["data"]["job"]
    return {
        k: v
        for k, v in job.items()
        if k
        not in (
            "id",
            "submitted_at",
            "queued_at",
            "reason",
            "state",
            "started_at",
            "ended_at",
            "pid",
            "attempt",
            "exit_code",
            "gpus",
            "gpu_uuids",
        )
    }


def add_through_typer(queue: QueueBox, args: list[str]) -> int:
    """The same command line through Typer, as `gpubox` runs it when the fast path declines."""
    code = "import sys; from gpubox.cli.app import run; sys.exit(run(sys.argv[1:]))"
    slow = subprocess.run(
        [sys.executable, "-c", code, "queue", "add", *args],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(slow.stdout)


def test_both_paths_store_the_same_job(queue: QueueBox, tmp_path: os.PathLike[str]) -> None:
    queue("queue", "pause")
    args = [
        "--name",
        "n",
        "--kind",
        "train",
        "--gpus",
        "0",
        "--priority",
        "3",
        "--time-limit",
        "2h",
        "--retries",
        "1",
        "--tag",
        "team=nlp",
        "--env",
        "A=1",
        "--cwd",
        str(tmp_path),
        "--shell",
        "--no-probe",
        "--",
        "echo hi | wc -c",
    ]
    fast = queue.add(*args)
    assert _stored(queue, fast) == _stored(queue, add_through_typer(queue, args))


def test_after_given_twice_waits_for_every_job_named_on_both_paths(queue: QueueBox) -> None:
    queue("queue", "pause")
    first, second, third = (queue.add("--gpus", "0", "--", "true") for _ in range(3))
    args = ["--gpus", "0", "--after", f"{first},{second}", "--after", str(third), "--", "true"]
    fast = queue.add(*args)
    for job_id in (fast, add_through_typer(queue, args)):
        assert _stored(queue, job_id)["after"] == [first, second, third]


def test_the_fast_path_does_not_import_typer(queue: QueueBox) -> None:
    queue("queue", "pause")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpubox", "queue", "add", "--gpus", "0", "--", "true"],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" not in imported and "rich" not in imported
    assert "typing" not in imported  # 4 ms of its start, for annotations only
    assert result.stdout.strip().isdigit()
