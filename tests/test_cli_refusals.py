"""Refusals and failures outside the queue: one line on stderr and a non-zero exit code, never a
traceback (a full disk under the output, an empty command, a state folder that is a file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def gpubox(
    *args: str, tmp_path: Path, stdout: object = subprocess.PIPE, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_")}
    base.update(HOME=str(tmp_path), GPUBOX_STATE_DIR=str(tmp_path / "state"), GPUBOX_RUNTIME_DIR=str(tmp_path / "run"))
    return subprocess.run(
        [sys.executable, "-m", "gpubox", *args],
        env={**base, **env},
        stdout=stdout,  # type: ignore[arg-type]
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )


def one_line(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stderr == f"gpubox: {text}\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full: no way to fail a write")
@pytest.mark.parametrize(
    "args",
    [("--version",), ("top", "--once", "--demo"), ("top", "--once", "--demo", "--json"), ("metrics", "dump", "--demo")],
)
def test_output_that_cannot_be_written_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    with open("/dev/full", "w") as full:
        result = gpubox(*args, tmp_path=tmp_path, stdout=full)
    one_line(result, 1, "cannot write the output: No space left on device")


def test_an_empty_command_to_run(tmp_path: Path) -> None:
    one_line(gpubox("run", "", tmp_path=tmp_path), 2, "the command is empty")


def test_a_daemon_whose_state_folder_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file")
    result = gpubox("daemon", tmp_path=tmp_path)
    one_line(result, 1, f"cannot use the daemon's folders ({tmp_path / 'state'} is not a folder)")


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_daemon_stop_refuses_a_timeout_it_cannot_wait(tmp_path: Path, value: str) -> None:
    result = gpubox("daemon", "stop", "--timeout", value, tmp_path=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("gpubox: invalid --timeout")


@pytest.mark.parametrize("args", [(), ("queue",), ("metrics",)])
def test_a_group_without_a_command_shows_its_help(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = gpubox(*args, tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"Usage: gpubox {' '.join(args)}".replace("  ", " ").rstrip() + " [OPTIONS]")
    assert "\\n" not in result.stderr and result.stderr.count("\n") > 5  # the help, on its lines


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("queue", "ls", "--state"), "gpubox queue ls"),
        (("top", "--gpu"), "gpubox top"),
        (("daemon", "stop", "--timeout"), "gpubox daemon stop"),
        (("queue", "ls", "--bogus"), "gpubox queue ls"),
        (("--bogus",), "gpubox"),
    ],
)
def test_a_usage_error_points_at_the_help_of_the_command_given(
    tmp_path: Path, args: tuple[str, ...], where: str
) -> None:
    # An option without its value is refused by the parser before the command is known to it.
    result = gpubox(*args, tmp_path=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.endswith(f" (see '{where} --help')\n"), result.stderr
