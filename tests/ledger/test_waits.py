"""Why jobs waited: the daemon hands the queue's reasons to the recorder with each sample, and the
report joins them with the hours when GPUs sat unallocated."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gpubox.ledger.findings import StoredWaits
from gpubox.ledger.recorder import Recorder, wait_kind
from gpubox.ledger.report import build_report
from gpubox.ledger.store import LedgerStore
from tests.helpers import run_gpubox
from tests.ledger.builders import T0, Clock, gpu, job, open_store, snap

H = 3600
NEEDS = "needs 2 GPUs with 60 GiB free: GPU 1 held by job 12 (train)"


def test_reasons_are_kept_by_kind_with_their_numbers_as_n() -> None:
    assert wait_kind(NEEDS) == "needs N GPU(s) with N GiB free: GPU N held by job N (train)"
    assert wait_kind("needs 1 GPU: GPU 0 held by job 4 (infer)") == "needs N GPU(s): GPU N held by job N (infer)"
    assert wait_kind("waits for 2 jobs to succeed") == wait_kind("waits for 1 job to succeed")
    assert wait_kind("waits for job 3.5 to succeed") == "waits for job N to succeed"
    assert wait_kind("  ") == "waits"


def record_two_hours(store: LedgerStore) -> None:
    """GPU 0 held by job 1 for two hours; GPU 1 unallocated both hours. Jobs 7 and 8 wait during the
    first hour only (job 7 for GPUs, job 8 behind a dependency); nothing waits the second hour."""
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    t = float(T0)
    while t <= T0 + 2 * H:
        clock.now = t
        gpus = [gpu("GPU-0", 0, gpu_busy=90.0), gpu("GPU-1", 1, gpu_busy=0.0)]
        waiting = {7: NEEDS, 8: "waits for job 3 to succeed"} if t <= T0 + H else {}
        recorder.record(snap(t, gpus), [job(1, "GPU-0")], waiting)
        t += 5
    recorder.close()


def test_unallocated_hours_are_findings_only_while_jobs_waited(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        record_two_hours(store)
        report = build_report(store, T0, T0 + 2 * H, "gpu", waits=StoredWaits(store))
        without = build_report(store, T0, T0 + 2 * H, "gpu")
    [hour] = report.unallocated_hours
    assert hour.hour_start == T0 and hour.gpus == ("1",) and hour.jobs_waiting == 2
    assert hour.unallocated_gpu_hours == 1.0  # GPU 1, free the whole hour while they waited
    assert hour.wait_reasons == (wait_kind(NEEDS), "waits for job N to succeed")
    # Without the queue's waits every unallocated hour is listed, with nulls for why.
    assert sorted(h.hour_start for h in without.unallocated_hours) == [T0, T0 + H]
    assert all(h.jobs_waiting is None and h.wait_reasons is None for h in without.unallocated_hours)


def test_wait_seconds_add_up_per_hour_and_survive_a_reopen(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        record_two_hours(store)
    with LedgerStore(tmp_path / "state" / "ledger.db", create=False) as store:
        rows = dict(store.rows("SELECT reason, job_ms FROM wait_reasons WHERE hour = ?", (T0,)))
        peaks = dict(store.rows("SELECT hour, peak_jobs FROM wait_hours"))
    # Each job waited the whole first hour: 3600 job-seconds per reason.
    assert rows == {wait_kind(NEEDS): 3_600_000, "waits for job N to succeed": 3_600_000}
    assert peaks == {T0: 2}


def test_the_report_says_why_jobs_waited_while_gpus_sat_unallocated(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        record_two_hours(store)
    since = datetime.fromtimestamp(T0, UTC).isoformat()
    until = datetime.fromtimestamp(T0 + 2 * H, UTC).isoformat()
    env = {"GPUBOX_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    res = run_gpubox("report", "--since", since, "--until", until, "--no-color", env=env)
    assert res.returncode == 0, res.stderr
    assert "Hours when GPUs sat unallocated" in res.stdout
    line = next(x for x in res.stdout.splitlines() if "GPU-h unallocated (GPU 1)" in x)
    assert "while up to 2 jobs waited" in line and "needs N GPU(s) with N GiB free" in line, line


def test_a_ledger_from_before_the_waits_gains_them(tmp_path: Path) -> None:
    import sqlite3

    from gpubox.ledger.schema import FREE_SCHEMA, SCHEMA, SCHEMA_VERSION, WAITS_SCHEMA

    path = tmp_path / "ledger.db"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(WAITS_SCHEMA, "").replace(FREE_SCHEMA, "") + "PRAGMA user_version = 1;")
    db.close()
    with LedgerStore(path) as store:
        assert store.rows("PRAGMA user_version") == [(SCHEMA_VERSION,)]
        assert store.rows("SELECT count(*) FROM wait_reasons") == [(0,)]


def test_a_gpu_freed_after_the_waiting_ended_is_no_finding(tmp_path: Path) -> None:
    """One GPU: job 1 holds it for the first half hour while job 2 waits for it; then job 1 ends and
    job 2 is cancelled, so the GPU sits free with nobody waiting. It was never free while a job
    waited, and the handovers of a few seconds between jobs are not findings either."""
    clock = Clock()
    with open_store(tmp_path) as store:
        recorder = Recorder(store, interval_s=5, clock=clock)
        t = float(T0)
        while t <= T0 + H:
            clock.now = t
            first_half = t < T0 + 1800
            handover = T0 + 600 <= t < T0 + 610  # between two of job 1's attempts, job 2 still waiting
            held = [] if handover or not first_half else [job(1, "GPU-0")]
            waiting = {2: "needs 1 GPU: GPU 0 held by job 1 (train)"} if first_half else {}
            recorder.record(snap(t, [gpu("GPU-0", 0, gpu_busy=50.0)]), held, waiting)
            t += 5
        recorder.close()
        report = build_report(store, T0, T0 + H, "gpu", waits=StoredWaits(store))
        [free] = store.rows("SELECT free_ms FROM wait_free")
    assert free == (10_000,)  # the handover, recorded as it was
    assert report.unallocated_hours == ()


def _waited_s(store: LedgerStore) -> tuple[float, float]:
    [(job_ms, free_ms)] = store.rows(
        "SELECT (SELECT SUM(job_ms) FROM wait_reasons), (SELECT SUM(free_ms) FROM wait_free)"
    )
    return job_ms / 1000, free_ms / 1000


def _record_waits(recorder: Recorder, clock: Clock, start: int, end: int) -> None:
    for t in range(start, end + 1, 5):
        clock.now = t
        recorder.record(snap(t, [gpu("GPU-0", 0, gpu_busy=0.0)]), [], {7: NEEDS})


def test_waits_are_not_counted_twice_when_the_clock_is_set_back(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        clock = Clock()
        recorder = Recorder(store, interval_s=5, clock=clock)
        _record_waits(recorder, clock, T0, T0 + 600)
        _record_waits(recorder, clock, T0 + 300, T0 + 900)  # set back 5 minutes, then on
        recorder.close()
        assert _waited_s(store) == (900.0, 900.0)  # as the GPU's own minutes: T0 .. T0 + 900, once


def test_waits_are_not_counted_twice_across_a_restart_with_the_clock_set_back(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        clock = Clock()
        first = Recorder(store, interval_s=5, clock=clock)
        _record_waits(first, clock, T0, T0 + 600)
        first.close()
        second = Recorder(store, interval_s=5, clock=clock)
        _record_waits(second, clock, T0 + 300, T0 + 900)
        second.close()
        # T0 .. T0 + 600, then from the first sample after T0 + 600 on (a new recorder starts there)
        assert _waited_s(store) == (895.0, 895.0)
