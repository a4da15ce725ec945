"""The fast path of `gpubox queue wait` (no Typer) knows exactly the options Typer's command has,
answers exactly as Typer's path does, and leaves everything unusual to Typer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from gpubox.cli import queue as queue_cli
from gpubox.cli.queue_wait_fast import parse
from tests.queue.conftest import QueueBox

HANG = 60.0


def test_the_fast_options_are_typers() -> None:
    command = typer.main.get_command(queue_cli.app).commands["wait"]  # type: ignore[attr-defined]
    typer_options = {opt for p in command.params for opt in p.opts if opt.startswith("--")} - {"--help"}
    assert typer_options == {"--timeout", "--json"}


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["--json"],
        ["--", "3"],
        ["+3"],
        ["-3"],
        ["٣"],  # a digit that Python reads as 3: left to Typer
        ["3", "--timeout"],
        ["3", "--timeout", "-1s"],
        ["3", "--bogus"],
    ],
)
def test_unusual_command_lines_go_to_typer(args: list[str]) -> None:
    assert parse(args) is None


def test_plain_command_lines_are_parsed() -> None:
    assert parse(["4", "2", "4", "--timeout", "30s", "--json"]) == ([4, 2], "30s", True)
    assert parse(["--timeout=0", "007"]) == ([7], "0", False)


def _through_typer(queue: QueueBox, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command line through Typer, as `gpubox` runs it when the fast path declines."""
    code = "import sys; from gpubox.cli.app import run; sys.exit(run(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "queue", "wait", *args],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        timeout=HANG,
    )


def _same(fast: Any, slow: Any) -> None:
    assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr)


def test_both_paths_answer_alike(queue: QueueBox, tmp_path: Path) -> None:
    ok = queue.add("--gpus", "0", "--", "true")
    failed = queue.add("--gpus", "0", "--shell", "--", "exit 3")
    assert queue("queue", "wait", str(ok), str(failed), timeout=HANG).returncode == 3
    for args in ([str(failed), str(ok)], [str(ok), "--json"], [str(failed), "--json"], ["999"], ["999", "--json"]):
        _same(queue("queue", "wait", *args, timeout=HANG), _through_typer(queue, *args))
    held = queue.add("--gpus", "0", "--shell", "--", f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done")
    for args in ([str(held), "--timeout", "0"], [str(held), "--timeout=0", "--json"], [str(held), "--timeout", "x"]):
        _same(queue("queue", "wait", *args, timeout=HANG), _through_typer(queue, *args))
    timed_out = queue("queue", "wait", str(held), "--timeout", "0", "--json")
    assert timed_out.returncode == 124 and json.loads(timed_out.stdout)["data"] is None
    (tmp_path / "go").touch()
    assert queue("queue", "wait", str(held), timeout=HANG).returncode == 0


def test_the_fast_path_does_not_import_typer(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "true")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpubox", "queue", "wait", str(job)],
        env={**os.environ, **queue.env},
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert result.returncode == 0, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" not in imported and "rich" not in imported
    assert "typing" not in imported  # 4 ms of its start, for annotations only
    assert result.stdout == f"job {job}: succeeded (exit 0)\n"
