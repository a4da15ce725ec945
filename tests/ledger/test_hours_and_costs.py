"""Known busy, idle and starved intervals, recorded through the recorder and the database, give
exactly the expected hours and costs in the report."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import LedgerReport, Prices, UsageRow, build_report
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, open_store, proc, snap

HOUR = 3600
PRICES = Prices(per_gpu_hour=2.0, per_kwh=0.25)


def one_hour(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    """Job 1 (train, alice, team=vision) holds GPU-0: busy the first half hour, idle the second,
    waiting for data a quarter of the time, drawing 300 W. GPU-1 is nobody's; bob runs a process
    on it outside the queue at 50% busy, and it draws 100 W with no energy counter."""
    elapsed = t - T0
    gpus = [
        gpu("GPU-0", 0, gpu_busy=100.0 if elapsed <= 1800 else 0.0, energy_mj=int(300_000 * elapsed)),
        gpu("GPU-1", 1, gpu_busy=50.0, power_w=100.0),
    ]
    procs = [proc(11, "GPU-0", job_id=1, loader_wait=0.25, mem=8 << 30), proc(12, "GPU-1", user="bob")]
    return snap(t, gpus, procs), [job(1, "GPU-0", team="vision")]


@pytest.fixture
def report_of_one_hour(tmp_path: Path) -> dict[str, LedgerReport]:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, one_hour, T0, T0 + HOUR)
    recorder.close()
    reports = {
        by: build_report(store, T0, T0 + HOUR, by, prices=PRICES, now=T0 + HOUR)
        for by in ("gpu", "job", "kind", "tag", "user")
    }
    store.close()
    return reports


def row(report: LedgerReport, group: str) -> UsageRow:
    [found] = [r for r in report.rows if r.group == group]
    return found


def test_by_gpu_calendar_busy_idle_starved_energy_and_cost(report_of_one_hour: dict[str, LedgerReport]) -> None:
    report = report_of_one_hour["gpu"]
    g0, g1 = row(report, "0"), row(report, "1")
    assert (g0.calendar_gpu_hours, g0.allocated_gpu_hours, g0.busy_gpu_hours) == (1.0, 1.0, 0.5)
    assert (g0.idle_allocated_gpu_hours, g0.starved_gpu_hours, g0.gap_gpu_hours) == (0.5, 0.25, 0.0)
    assert g0.busy_source == "gpu_busy" and g0.unqueued_gpu_hours == 0.0
    assert g0.energy_kwh == pytest.approx(0.3, abs=1e-12) and g0.energy_estimated_kwh == 0.0
    assert g0.gpu_hour_cost == 2.0 and g0.cost == pytest.approx(2.0 + 0.3 * 0.25, abs=1e-12)
    assert (g1.calendar_gpu_hours, g1.allocated_gpu_hours, g1.busy_gpu_hours, g1.unqueued_gpu_hours) == (
        1.0,
        0.0,
        0.5,
        1.0,
    )
    assert g1.starved_gpu_hours is None  # never known: null, not 0
    assert g1.energy_kwh == pytest.approx(0.1, abs=1e-12) and g1.energy_estimated_kwh == g1.energy_kwh
    assert g1.mean_sm_occupancy is None and g1.pcie_rx_bytes is None
    total = report.total
    assert (total.calendar_gpu_hours, total.allocated_gpu_hours, total.busy_gpu_hours) == (2.0, 1.0, 1.0)
    assert total.cost == pytest.approx(4.0 + 0.4 * 0.25, abs=1e-12)
    assert report.recorded_until == T0 + HOUR and not report.recording_stale


def test_by_job_kind_tag_and_user_cost_the_allocated_hours(report_of_one_hour: dict[str, LedgerReport]) -> None:
    j = row(report_of_one_hour["job"], "1")
    assert (j.job_id, j.job_name, j.kind, j.user, j.attempts) == (1, "job1", "train", "alice", 1)
    assert (j.allocated_gpu_hours, j.busy_gpu_hours, j.idle_allocated_gpu_hours, j.starved_gpu_hours) == (
        1,
        0.5,
        0.5,
        0.25,
    )
    assert j.calendar_gpu_hours is None and j.peak_gpu_mem_bytes == 8 << 30
    assert j.gpu_hour_cost == 2.0 and j.cost == pytest.approx(2.075, abs=1e-12)
    assert row(report_of_one_hour["kind"], "train").allocated_gpu_hours == 1.0
    tag = row(report_of_one_hour["tag"], "team=vision")
    assert tag.tag == "team=vision" and tag.cost == pytest.approx(2.075, abs=1e-12)
    users = report_of_one_hour["user"]
    assert (row(users, "alice").allocated_gpu_hours, row(users, "alice").unqueued_gpu_hours) == (1.0, 0.0)
    assert (row(users, "bob").allocated_gpu_hours, row(users, "bob").unqueued_gpu_hours) == (0.0, 1.0)
    assert users.total.unqueued_gpu_hours == 1.0


def test_findings_name_the_idle_and_starved_attempt(report_of_one_hour: dict[str, LedgerReport]) -> None:
    report = report_of_one_hour["job"]
    [idle] = report.idle_attempts
    [starved] = report.starved_attempts
    assert (idle.job_id, idle.idle_allocated_gpu_hours) == (1, 0.5)
    assert (starved.job_id, starved.starved_gpu_hours, starved.tags) == (1, 0.25, {"team": "vision"})
    # GPU-1 was neither held nor idle (bob used it): nothing sat unallocated
    assert report.unallocated_hours == ()


def test_every_row_has_every_key(report_of_one_hour: dict[str, LedgerReport]) -> None:
    from dataclasses import asdict, fields

    names = [f.name for f in fields(UsageRow)]
    for report in report_of_one_hour.values():
        for r in (*report.rows, report.total):
            assert list(asdict(r)) == names
