"""`gpubox queue show ID` adds the job's GPU use from the ledger: one line, and `usage` in --json."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpubox.ledger.attempt_lookup import job_usage, recorded_job_usage
from gpubox.ledger.store import LedgerStore
from gpubox.queue.jobs import JobSpec
from gpubox.queue.store import JobStore
from tests.helpers import run_gpubox
from tests.ledger.builders import T0
from tests.report.conftest import Box

H = 3600


def queue_jobs(box: Box, count: int) -> None:
    """`count` jobs in the box's queue, each started once and succeeded (ids 1..count), in the
    ledger's time: it has caught up with their ends."""
    store = JobStore(box.state_dir / "queue.db", clock=lambda: T0)
    try:
        for _ in range(count):
            job = store.add(JobSpec(argv=("python", "train.py"), kind="train", gpus=0))
            assert store.mark_started(job.id, pid=None, gpu_uuids=(), boot_id="test")
            store.finish(job.id, 1, 0, "succeeded")
    finally:
        store.close()


def show(box: Box, job_id: int, *args: str) -> Any:
    result = run_gpubox("queue", "show", str(job_id), *args, env=box.env)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == ""
    return json.loads(result.stdout) if "--json" in args else result.stdout


def test_the_usage_line_and_key(recorded: Box) -> None:
    queue_jobs(recorded, 3)
    text = show(recorded, 1)
    line = next(line for line in text.splitlines() if line.startswith("  gpu use"))
    assert line == (
        "  gpu use     2h00m GPU-time allocated over 1 attempt, busy 1h30m (75%), idle while allocated 30m,"
        " starved 24m, energy 0.6 kWh"
    )
    usage = show(recorded, 1, "--json")["data"]["usage"]
    assert (usage["job_id"], usage["attempts"], usage["allocated_gpu_hours"]) == (1, 1, 2.0)
    assert (usage["busy_gpu_hours"], usage["busy_share"], usage["busy_source"]) == (1.5, 0.75, "gpu_busy")
    assert (usage["idle_allocated_gpu_hours"], usage["starved_gpu_hours"]) == (0.5, 0.4)
    assert usage["energy_kwh"] == pytest.approx(0.6) and usage["peak_gpu_mem_bytes"] == 8 << 30
    # job 2 never knew its loader wait: starved is unknown, not 0
    assert "starved not measured" in show(recorded, 2)
    assert show(recorded, 2, "--json")["data"]["usage"]["starved_gpu_hours"] is None


def test_a_job_the_ledger_never_saw(recorded: Box) -> None:
    queue_jobs(recorded, 3)
    assert "  gpu use     not recorded\n" in show(recorded, 3)
    assert show(recorded, 3, "--json")["data"]["usage"] is None


def test_no_ledger_yet(box: Box) -> None:
    queue_jobs(box, 1)
    assert "  gpu use     not recorded\n" in show(box, 1)
    assert show(box, 1, "--json")["data"]["usage"] is None
    assert not (box.state_dir / "ledger.db").exists()


def test_a_damaged_ledger_is_said_once_and_the_job_still_shown(box: Box) -> None:
    queue_jobs(box, 1)
    (box.state_dir / "ledger.db").write_bytes(b"not a database" * 100)
    result = run_gpubox("queue", "show", "1", env=box.env)
    assert result.returncode == 0 and "  gpu use     not shown: the ledger cannot be read\n" in result.stdout
    assert result.stderr.startswith("gpubox: GPU use not shown: ") and result.stderr.count("\n") == 1
    result = run_gpubox("queue", "show", "1", "--json", env=box.env)
    doc = json.loads(result.stdout)
    assert result.returncode == 0 and doc["data"]["usage"] is None and doc["data"]["job"]["id"] == 1
    [error] = doc["errors"]  # told apart from "nothing recorded", whose errors are empty
    assert error.startswith("GPU use not shown: ") and "corrupt" in error


def test_the_lookup_sums_every_attempt(box: Box) -> None:
    from gpubox.ledger.recorder import Recorder
    from tests.ledger.builders import Clock, drive, gpu, job, proc, snap

    def retried(t: float) -> Any:
        """Job 5 runs on GPU 0 for an hour (attempt 1, idle), then again for an hour (attempt 2, busy)."""
        second = t - T0 > H
        g = gpu("GPU-0", 0, gpu_busy=100.0 if second else 0.0)
        return snap(t, [g], [proc(1, "GPU-0", job_id=5)]), [job(5, "GPU-0", attempt=2 if second else 1)]

    store = LedgerStore(box.state_dir / "ledger.db")
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, retried, T0, T0 + 2 * H)
    recorder.close()
    usage = job_usage(store, 5)
    assert usage is not None
    assert (usage.attempts, usage.allocated_gpu_hours, usage.busy_gpu_hours, usage.idle_allocated_gpu_hours) == (
        2,
        2.0,
        1.0,
        1.0,
    )
    assert (usage.first_at, usage.last_at, usage.busy_share) == (T0, T0 + 2 * H, 0.5)
    assert usage.starved_gpu_hours is None and usage.energy_kwh is None
    assert job_usage(store, 6) is None
    store.close()
    assert recorded_job_usage(5, box.state_dir / "ledger.db") == usage
    assert recorded_job_usage(5, box.state_dir / "missing.db") is None
