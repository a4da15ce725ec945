"""A ledger with known hours, energy and costs, in a private state directory, and the CLI run
against it as a subprocess (what a person or a cron job sees)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.helpers import run_gpubox
from tests.ledger.builders import T0, Clock, drive, gpu, job, proc, snap

H = 3600
SINCE = datetime.fromtimestamp(T0, UTC).isoformat()  # the window: the two recorded hours exactly
UNTIL = datetime.fromtimestamp(T0 + 2 * H, UTC).isoformat()


def two_hours(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    """Two GPUs for two hours. Job 1 (train, alice, team=vision, project=p1) holds GPU 0 the whole
    time: 75% busy, waiting for data 20% of the time, drawing 300 W. Job 2 (infer, bob,
    team=speech) holds GPU 1 the first hour at 50% busy; the second hour GPU 1 sits idle and
    unallocated. GPU 1 draws 150 W."""
    elapsed = t - T0
    second = elapsed > H
    gpus = [
        gpu("GPU-0", 0, gpu_busy=75.0, energy_mj=int(300_000 * elapsed)),
        gpu("GPU-1", 1, gpu_busy=0.0 if second else 50.0, energy_mj=int(150_000 * elapsed)),
    ]
    procs = [proc(10, "GPU-0", job_id=1, loader_wait=0.2, mem=8 << 30)]
    allocations = [job(1, "GPU-0", team="vision", project="p1")]
    if not second:
        procs.append(proc(20, "GPU-1", user="bob", job_id=2, mem=2 << 30))
        allocations.append(job(2, "GPU-1", kind="infer", user="bob", team="speech"))
    return snap(t, gpus, procs), allocations


@dataclass
class Box:
    """A private state directory and the environment that points gpubox at it."""

    home: Path

    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    @property
    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "GPUBOX_STATE_DIR": str(self.state_dir),
            "GPUBOX_RUNTIME_DIR": str(self.home / "run"),
            "GPUBOX_SYSTEM_CONFIG": str(self.home / "etc-gpubox-config.toml"),
        }

    def record(self) -> None:
        store = LedgerStore(self.state_dir / "ledger.db")
        clock = Clock()
        recorder = Recorder(store, interval_s=5, clock=clock)
        drive(recorder, clock, two_hours, T0, T0 + 2 * H)
        recorder.close()
        store.close()

    def report(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`gpubox report ARGS` against this box."""
        return run_gpubox("report", *args, env={**self.env, **(env or {})})

    def report_json(self, *args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        result = self.report("--json", "--since", SINCE, "--until", UNTIL, *args, env=env)
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
        doc: dict[str, Any] = json.loads(result.stdout)
        return doc


@pytest.fixture
def box(isolated_env: Path) -> Box:
    """A state directory with no ledger in it yet."""
    return Box(isolated_env)


@pytest.fixture
def recorded(box: Box) -> Box:
    """The same, with the two recorded hours of `two_hours`."""
    box.record()
    return box


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single line of stderr of a command that failed with `code` (no traceback)."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: "), result.stderr
    return lines[0]
