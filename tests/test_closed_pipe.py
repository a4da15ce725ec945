"""A reader that goes away early (`gpubox report --csv | head -1`) ends gpubox as it ends any Unix
tool: nothing on stderr, not even Python's "Exception ignored" on the way out, and exit 141
(128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended). Real pipes, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubox.exit_codes import ExitCode
from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.store import LedgerStore
from gpubox.queue.jobs import JobSpec
from gpubox.queue.store import JobStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, proc, snap

PIPE_CAPACITY = 64 << 10  # Linux's default: more than this cannot be written before the reader reads


def _env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "GPUBOX_STATE_DIR": str(home / "state"),
        "GPUBOX_RUNTIME_DIR": str(home / "run"),
        **(extra or {}),
    }


def first_line_then_close(args: Iterable[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run `gpubox ARGS`, read its first line, close the pipe: (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpubox", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    return proc.wait(timeout=60), stderr


def into_closed_pipe(args: Iterable[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run `gpubox ARGS` with stdout a pipe whose reader has gone already (output too short to
    outrun a reader that closes after one line): (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpubox", *args],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=dict(env),
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    return result.returncode, result.stderr


def _a_job_a_minute(t: float) -> tuple[BoxSnapshot, list[Allocation]]:
    """One GPU, held by a new queue job every minute: one CSV row per job with --by job."""
    job_id = int((t - T0) // 60) + 1
    return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0)], [proc(10, "GPU-0", job_id=job_id)]), [job(job_id, "GPU-0")]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_report_csv_whose_reader_leaves_after_one_line(tmp_path: Path) -> None:
    store = LedgerStore(tmp_path / "state" / "ledger.db")
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, _a_job_a_minute, T0, T0 + 24 * 3600)
    recorder.close()
    store.close()
    args = ["report", "--csv", "--by", "job", "--since", _iso(T0 - 3600), "--until", _iso(T0 + 25 * 3600)]
    whole = subprocess.run(
        [sys.executable, "-m", "gpubox", *args], capture_output=True, env=_env(tmp_path), timeout=60, check=True
    )
    assert len(whole.stdout) > 2 * PIPE_CAPACITY  # the reader leaves while gpubox still writes

    assert first_line_then_close(args, _env(tmp_path)) == (ExitCode.READER_LEFT, "")


def test_queue_ls_whose_reader_leaves_after_one_line(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "state" / "queue.db")
    spec = JobSpec(argv=("sleep", "1000"), cwd="/", env={}, gpus=0, probe=False)
    store.add_many([spec] * 1500)
    store.close()
    whole = subprocess.run(
        [sys.executable, "-m", "gpubox", "queue", "ls", "--all"],
        capture_output=True,
        env=_env(tmp_path),
        timeout=60,
        check=True,
    )
    assert len(whole.stdout) > 2 * PIPE_CAPACITY

    assert first_line_then_close(["queue", "ls", "--all"], _env(tmp_path)) == (ExitCode.READER_LEFT, "")


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("queue", "--help"),
        ("report", "--help"),
        ("--version",),  # answered before Typer
        ("top", "--once", "--demo", "--interval", "0.05"),  # rich's console
        ("top", "--once", "--demo", "--interval", "0.05", "--json"),
        ("queue", "ls", "--json"),
        ("metrics", "dump", "--demo"),
    ],
    ids=" ".join,
)
def test_output_into_a_pipe_whose_reader_left(tmp_path: Path, args: tuple[str, ...]) -> None:
    assert into_closed_pipe(args, _env(tmp_path)) == (ExitCode.READER_LEFT, "")


def test_queue_add_fast_path_into_a_pipe_whose_reader_left(tmp_path: Path) -> None:
    """A plain `queue add` (no Typer) stores the job, then finds no one to tell its id to."""
    env = _env(tmp_path)
    try:
        assert into_closed_pipe(["queue", "add", "--gpus", "0", "--", "true"], env) == (ExitCode.READER_LEFT, "")
        listed = subprocess.run(
            [sys.executable, "-m", "gpubox", "queue", "ls", "--all", "--json"], capture_output=True, env=env, timeout=60
        )
        assert b'"id": 1' in listed.stdout, listed
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpubox", "daemon", "stop"], capture_output=True, env=env, timeout=60, check=False
        )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full: no way to fail a write")
def test_a_full_disk_is_still_a_failure(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "gpubox", "--help"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(tmp_path),
            timeout=60,
        )
    assert (result.returncode, result.stderr) == (
        ExitCode.FAILED,
        "gpubox: cannot write the output: No space left on device\n",
    )
