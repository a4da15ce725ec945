"""A GPUBOX_* variable gpubox does not know (a misspelt one, most likely) is warned about once per
command that reads settings, and the command goes on; one that gpubox reads or sets never is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.config import SCHEMA, env_name
from gpubox.env_vars import known_variables, unknown_variables
from tests.helpers import REPO

NAME = re.compile(r"\bGPUBOX_[A-Z0-9_]*[A-Z0-9]\b")
# gpubox itself, and the scripts and examples that run it with their own GPUBOX_* variables set.
SOURCES = ("gpubox", "scripts", "examples", "benchmarks")


def test_every_name_in_the_source_is_known() -> None:
    """A variable added to gpubox without adding it to gpubox/env_vars.py would be warned about."""
    found: dict[str, str] = {}
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".sh", ""} and "__pycache__" not in path.parts:
                for name in NAME.findall(path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(REPO)))
    assert "GPUBOX_JOB_ATTEMPT" in found and "GPUBOX_STATE_DIR" in found  # the scan sees the source
    missing = {name: where for name, where in found.items() if name not in known_variables()}
    assert not missing, f"add these to OWN_VARIABLES in gpubox/env_vars.py: {missing}"


def test_the_variables_gpubox_reads_and_sets_get_no_warning() -> None:
    env = {name: "1" for name in known_variables()}
    assert {env_name(key) for key in SCHEMA} <= set(env)
    for name in ("GPUBOX_JOB_ID", "GPUBOX_JOB_KIND", "GPUBOX_JOB_ATTEMPT", "GPUBOX_JOB_LOG", "GPUBOX_SYSTEM_CONFIG"):
        assert name in env
    assert unknown_variables({**env, "PATH": "/bin", "GPUBOX": "/usr/bin/gpubox"}) == []


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("GPUBOX_STAT_DIR", "GPUBOX_STATE_DIR"),
        ("GPUBOX_QUEUE_PREEMT", "GPUBOX_QUEUE_PREEMPT"),
        ("GPUBOX_top_interval", "GPUBOX_TOP_INTERVAL"),
        ("GPUBOX_JOBID", "GPUBOX_JOB_ID"),
        ("GPUBOX_FOO", None),  # nothing close: no suggestion, however much the prefix matches
    ],
)
def test_an_unknown_name_is_said_with_the_known_one_it_is_close_to(name: str, meant: str | None) -> None:
    hint = f" (did you mean {meant}?)" if meant else ""
    assert unknown_variables({name: "x", "GPUBOX_STATE_DIR": "/s"}) == [f"{name} is not a gpubox variable{hint}"]


def _gpubox(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOX_", "XDG_"))}
    env.update(
        HOME=str(tmp_path),
        GPUBOX_STATE_DIR=str(tmp_path / "state"),
        GPUBOX_RUNTIME_DIR=str(tmp_path / "run"),
        GPUBOX_SYSTEM_CONFIG=str(tmp_path / "system.toml"),
        **extra,
    )
    return subprocess.run(
        [sys.executable, "-m", "gpubox", *args],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


WARNING = "gpubox: warning: GPUBOX_STAT_DIR is not a gpubox variable (did you mean GPUBOX_STATE_DIR?)"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("queue", "ls"), 0),
        (("queue", "add", "--gpus", "0", "--after", "7", "--", "true"), 2),  # without Typer; refused
        (("queue", "show", "7"), 2),
        (("top", "--once", "--demo"), 0),
        (("doctor",), None),  # it reads its settings twice
        (("report",), None),  # 1 (nothing recorded), or 3 where NVML cannot start
        (("metrics", "dump", "--demo"), 0),
        (("daemon", "status"), 4),
        (("daemon", "stop"), 0),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else str(value),
)
def test_every_command_that_reads_settings_warns_once_and_goes_on(
    tmp_path: Path, args: tuple[str, ...], code: int | None
) -> None:
    quiet = _gpubox(tmp_path, *args)
    loud = _gpubox(tmp_path, *args, GPUBOX_STAT_DIR=str(tmp_path / "elsewhere"))
    assert "Traceback" not in loud.stderr, loud.stderr
    assert loud.returncode == quiet.returncode and code in (None, loud.returncode), loud.stderr
    assert loud.stderr.splitlines() == [WARNING, *quiet.stderr.splitlines()]
    assert not (tmp_path / "elsewhere").exists()


def test_version_reads_no_settings_and_warns_of_nothing(tmp_path: Path) -> None:
    result = _gpubox(tmp_path, "--version", GPUBOX_STAT_DIR="x")
    assert (result.returncode, result.stderr) == (0, "")
