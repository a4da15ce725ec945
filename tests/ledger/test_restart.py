"""A recorder that starts again on the same database neither counts an interval twice nor loses
what was written; what was not written becomes a gap, and so does the time the daemon was down."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import UsageRow, build_report
from gpubox.ledger.rollup import Batch
from gpubox.ledger.store import LedgerError, LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, job, open_store, snap


def busy_job(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    return snap(t, [gpu(gpu_busy=100.0, energy_mj=int(100_000 * (t - T0)))]), [job(1, "GPU-0")]


def gpu_row(store: LedgerStore, until: float) -> UsageRow:
    [found] = build_report(store, T0, until, "gpu", now=until).rows
    return found


def test_a_clean_restart_counts_every_second_once(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    first = Recorder(store, interval_s=5, clock=clock)
    drive(first, clock, busy_job, T0, T0 + 600)
    first.close()
    second = Recorder(open_store(tmp_path), interval_s=5, clock=clock)
    # the sample it is handed first was recorded already, and an older one arrives late
    drive(second, clock, busy_job, T0 + 600, T0 + 600)
    drive(second, clock, busy_job, T0 + 300, T0 + 300)
    drive(second, clock, busy_job, T0 + 605, T0 + 1200)
    second.close()
    r = gpu_row(store, T0 + 1200)
    assert (r.observed_gpu_hours, r.busy_gpu_hours, r.gap_gpu_hours) == (1200 / 3600, 1200 / 3600, 0.0)
    assert r.energy_kwh == 1200 * 100 / 3.6e6
    [attempt] = build_report(store, T0, T0 + 1200, "job", now=T0 + 1200).rows
    assert attempt.allocated_gpu_hours == 1200 / 3600


def test_a_crash_loses_only_the_unwritten_minute_and_marks_it_a_gap(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    crashed = Recorder(store, interval_s=5, clock=clock)
    drive(crashed, clock, busy_job, T0, T0 + 630)  # written once a minute: last at T0 + 600
    del crashed  # no close(): what it gathered after T0 + 600 is gone
    restarted = Recorder(open_store(tmp_path), interval_s=5, clock=clock)
    drive(restarted, clock, busy_job, T0 + 635, T0 + 1200)
    restarted.close()
    r = gpu_row(store, T0 + 1200)
    assert r.observed_gpu_hours == (600 + 565) / 3600  # every written minute, and all after the restart
    assert r.gap_gpu_hours == 35 / 3600  # T0 + 600 .. T0 + 635: longer than the max gap of 15 s
    assert r.calendar_gpu_hours == 1200 / 3600


def test_a_quick_restart_within_the_max_gap_is_attributed(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    first = Recorder(store, interval_s=5, clock=clock)
    drive(first, clock, busy_job, T0, T0 + 600)
    first.close()
    second = Recorder(store, interval_s=5, clock=clock)
    drive(second, clock, busy_job, T0 + 610, T0 + 1200)  # one sample missed: 10 s, under 15
    second.close()
    r = gpu_row(store, T0 + 1200)
    assert (r.observed_gpu_hours, r.gap_gpu_hours) == (1200 / 3600, 0.0)
    assert r.energy_kwh == 1200 * 100 / 3.6e6  # the counter carried across the restart


def test_the_time_since_recording_stopped_is_an_open_gap(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, busy_job, T0, T0 + 600)
    recorder.close()
    report = build_report(store, T0, T0 + 7200, "gpu", now=T0 + 7200)
    [r] = report.rows
    assert report.recording_stale and report.recorded_until == T0 + 600
    assert (r.observed_gpu_hours, r.gap_gpu_hours, r.calendar_gpu_hours) == (600 / 3600, 6600 / 3600, 2.0)
    # a window that ends before now counts the open gap up to its end only
    assert gpu_row(store, T0 + 3600).calendar_gpu_hours == 1.0


def test_a_gpu_that_stops_being_sampled_gets_a_gap_when_it_comes_back(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)

    def flaky(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        both = [gpu("GPU-0", 0, gpu_busy=10.0), gpu("GPU-1", 1, gpu_busy=10.0)]
        return snap(t, both if not T0 + 100 < t < T0 + 400 else both[:1]), []

    drive(recorder, clock, flaky, T0, T0 + 600)
    recorder.close()
    rows = {r.group: r for r in build_report(store, T0, T0 + 600, "gpu", now=T0 + 600).rows}
    assert rows["0"].gap_gpu_hours == 0.0 and rows["0"].observed_gpu_hours == 600 / 3600
    assert rows["1"].gap_gpu_hours == 300 / 3600 and rows["1"].observed_gpu_hours == 300 / 3600
    assert rows["1"].calendar_gpu_hours == 600 / 3600


def test_an_energy_counter_reset_is_a_gap_for_energy_only(tmp_path: Path) -> None:
    def reloaded(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        # 100 W; the driver reloads at T0 + 600 and the counter starts again from 0
        counter = 100_000 * (t - T0) if t < T0 + 600 else 100_000 * (t - T0 - 600)
        return snap(t, [gpu(gpu_busy=100.0, energy_mj=int(counter), power_w=100.0)]), []

    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, reloaded, T0, T0 + 1200)
    recorder.close()
    r = gpu_row(store, T0 + 1200)
    assert r.observed_gpu_hours == r.busy_gpu_hours == 1200 / 3600
    assert r.energy_kwh == (1200 - 5) * 100 / 3.6e6  # all but the interval in which it went backwards
    assert r.energy_estimated_kwh == 0.0


def test_an_empty_ledger_reports_nothing_with_explicit_nulls(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    report = build_report(store, T0, T0 + 3600, "gpu", now=T0 + 3600)
    assert report.rows == () and report.recorded_until is None and not report.recording_stale
    assert report.total.calendar_gpu_hours == 0.0 and report.total.busy_gpu_hours is None
    assert report.total.cost is None and report.idle_attempts == report.unallocated_hours == ()


def test_a_failed_write_keeps_its_increments_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path)
    clock = Clock(T0)
    recorder = Recorder(store, interval_s=5, clock=clock)  # writes at T0 + 60, T0 + 120, ...
    real_write = store.write
    failing = [True]

    def write(batch: Batch) -> None:
        if failing[0]:
            raise LedgerError("disk full")
        real_write(batch)

    monkeypatch.setattr(store, "write", write)
    with pytest.raises(LedgerError):
        drive(recorder, clock, busy_job, T0, T0 + 60)
    drive(recorder, clock, busy_job, T0 + 65, T0 + 115)  # fails at T0 + 120, not reached
    failing[0] = False
    drive(recorder, clock, busy_job, T0 + 120, T0 + 120)
    recorder.close()
    assert gpu_row(store, T0 + 120).observed_gpu_hours == 120 / 3600


class FullDisk:
    """The store's connection, except that COMMIT fails as it does on a full disk."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def test_a_failed_commit_is_a_ledger_error_and_the_next_write_has_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path)
    clock = Clock(T0)
    recorder = Recorder(store, interval_s=5, clock=clock)  # writes at T0 + 60, T0 + 120, ...
    real = store._db
    monkeypatch.setattr(store, "_db", FullDisk(real))
    with pytest.raises(LedgerError, match="disk is full") as failed:
        drive(recorder, clock, busy_job, T0, T0 + 60)
    assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
    assert not real.in_transaction  # rolled back: the next write can begin
    monkeypatch.setattr(store, "_db", real)
    drive(recorder, clock, busy_job, T0 + 65, T0 + 120)
    recorder.close()
    assert gpu_row(store, T0 + 120).observed_gpu_hours == 120 / 3600
    assert gpu_row(store, T0 + 120).busy_gpu_hours == 120 / 3600


@pytest.mark.parametrize(
    ("start", "end", "observed", "gap"),
    [
        (600, 630, 0, 30),  # inside the gap: nothing observed, all of it a gap
        (610, 650, 15, 25),  # the minute observed 635..660; the window holds 15 s of that
        (590, 640, 15, 35),  # a whole-minute part before, then the cut minute
    ],
)
def test_a_window_that_cuts_a_minute_with_a_gap_never_exceeds_the_window(
    tmp_path: Path, start: int, end: int, observed: int, gap: int
) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    crashed = Recorder(store, interval_s=5, clock=clock)
    drive(crashed, clock, busy_job, T0, T0 + 630)  # written up to T0 + 600
    del crashed
    restarted = Recorder(open_store(tmp_path), interval_s=5, clock=clock)
    drive(restarted, clock, busy_job, T0 + 635, T0 + 1200)
    restarted.close()
    [r] = build_report(store, T0 + start, T0 + end, "gpu", now=T0 + 1200).rows
    assert r.observed_gpu_hours * 3600 == pytest.approx(observed, abs=1e-6)
    assert r.gap_gpu_hours * 3600 == pytest.approx(gap, abs=1e-6)
    assert r.calendar_gpu_hours * 3600 == pytest.approx(end - start, abs=1e-6)
    assert r.allocated_gpu_hours * 3600 == pytest.approx(observed, abs=1e-6)


def test_a_window_that_cuts_the_minute_recording_stopped_in(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, busy_job, T0, T0 + 630)
    recorder.close()  # observed up to T0 + 630, then an open gap
    [r] = build_report(store, T0 + 615, T0 + 645, "gpu", now=T0 + 7200).rows
    assert (r.observed_gpu_hours * 3600, r.gap_gpu_hours * 3600) == pytest.approx((15, 15), abs=1e-6)
