"""Grouping, windows, per-attempt sums, MIG, and the unallocated-hours finding with its hook."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from gpubox.cli.report_view import notes
from gpubox.ledger.accounting import Allocation
from gpubox.ledger.findings import WaitSummary
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import Prices, UsageRow, build_report
from gpubox.ledger.series import gpu_series
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, Scene, drive, gpu, job, open_store, proc, snap

H = 3600


def recorded(tmp_path: Path, scene: Scene, start: float, end: float) -> LedgerStore:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, scene, start, end)
    recorder.close()
    return store


def rows(store: LedgerStore, since: float, until: float, by: str, **kw: object) -> dict[str, UsageRow]:
    return {r.group: r for r in build_report(store, since, until, by, now=until, **kw).rows}  # type: ignore[arg-type]


def teams(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    """Four GPUs for two hours: job 1 (vision, train) holds GPUs 0 and 1; job 2 (speech, infer,
    bob) holds GPU 2 for the first hour and job 3 (untagged, batch, bob) for the second; GPU 3 is
    idle and unallocated; carol and dave share GPU 3 outside the queue in the second hour."""
    second = t - T0 > H
    gpus = [gpu(f"GPU-{i}", i, gpu_busy=b) for i, b in enumerate((80.0, 40.0, 50.0, 20.0))]
    procs = [proc(1, "GPU-0", job_id=1, mem=10), proc(2, "GPU-1", job_id=1, mem=30), proc(3, "GPU-1", job_id=1, mem=5)]
    allocations = [job(1, "GPU-0", "GPU-1", team="vision", project="p1")]
    if second:
        allocations.append(job(3, "GPU-2", kind="batch", user="bob"))
        procs += [proc(4, "GPU-3", user="carol"), proc(5, "GPU-3", user="dave")]
    else:
        allocations.append(job(2, "GPU-2", kind="infer", user="bob", team="speech"))
    return snap(t, gpus, procs), allocations


@pytest.fixture
def store(tmp_path: Path) -> LedgerStore:
    return recorded(tmp_path, teams, T0, T0 + 2 * H)


def test_per_attempt_sums_over_its_gpus(store: LedgerStore) -> None:
    j = rows(store, T0, T0 + 2 * H, "job")
    assert (j["1"].allocated_gpu_hours, j["1"].busy_gpu_hours, j["1"].idle_allocated_gpu_hours) == (4.0, 2.4, 1.6)
    assert j["1"].peak_gpu_mem_bytes == 35  # the most its processes held on one GPU
    assert (j["2"].allocated_gpu_hours, j["3"].allocated_gpu_hours) == (1.0, 1.0)
    assert list(j) == ["1", "2", "3"]


def test_grouping_by_tag_each_pair_or_one_key(store: LedgerStore) -> None:
    pairs = rows(store, T0, T0 + 2 * H, "tag", prices=Prices(per_gpu_hour=3.0))
    assert set(pairs) == {"team=vision", "project=p1", "team=speech", "(untagged)"}
    assert pairs["(untagged)"].tag is None and pairs["(untagged)"].allocated_gpu_hours == 1.0  # job 3
    assert pairs["team=vision"].allocated_gpu_hours == pairs["project=p1"].allocated_gpu_hours == 4.0
    assert pairs["team=vision"].cost == 12.0 and pairs["team=speech"].cost == 3.0
    by_team = rows(store, T0, T0 + 2 * H, "tag", tag_key="team")
    assert set(by_team) == {"team=vision", "team=speech", "(no team tag)"}
    assert by_team["(no team tag)"].tag is None and by_team["(no team tag)"].allocated_gpu_hours == 1.0
    report = build_report(store, T0, T0 + 2 * H, "tag", now=T0 + 2 * H)
    assert report.total.allocated_gpu_hours == 6.0  # overlapping tags do not count twice in the total


def test_a_tag_whose_value_reads_none_keeps_its_own_row_apart_from_the_untagged(tmp_path: Path) -> None:
    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        gpus = [gpu("GPU-0", 0, gpu_busy=50.0), gpu("GPU-1", 1, gpu_busy=50.0)]
        return snap(t, gpus, []), [job(1, "GPU-0", team="(none)"), job(2, "GPU-1")]

    by_team = rows(recorded(tmp_path, scene, T0, T0 + H), T0, T0 + H, "tag", tag_key="team")
    assert {k: (r.tag, r.allocated_gpu_hours) for k, r in by_team.items()} == {
        "team=(none)": ("team=(none)", 1.0),
        "(no team tag)": (None, 1.0),
    }


def test_grouping_by_kind_and_user_with_unqueued_use(store: LedgerStore) -> None:
    kinds = rows(store, T0, T0 + 2 * H, "kind")
    assert {k: r.allocated_gpu_hours for k, r in kinds.items()} == {"train": 4.0, "infer": 1.0, "batch": 1.0}
    assert list(kinds) == ["train", "batch", "infer"]  # most allocated first, then by name
    users = rows(store, T0, T0 + 2 * H, "user")
    assert (users["alice"].allocated_gpu_hours, users["bob"].allocated_gpu_hours) == (4.0, 2.0)
    assert (users["carol"].unqueued_gpu_hours, users["dave"].unqueued_gpu_hours) == (0.5, 0.5)
    assert users["carol"].allocated_gpu_hours == 0.0 and users["carol"].attempts == 0


def test_unallocated_hours_and_the_hook_for_why_jobs_waited(store: LedgerStore) -> None:
    report = build_report(store, T0, T0 + 2 * H, "gpu", now=T0 + 2 * H)
    # GPU 3 sat unallocated the first hour; in the second, carol and dave used it
    [hour] = report.unallocated_hours
    assert (hour.hour_start, hour.unallocated_gpu_hours, hour.gpus) == (T0, 1.0, ("3",))
    assert hour.jobs_waiting is None and hour.wait_reasons is None

    class Waits:
        def __init__(self, waited: bool) -> None:
            self.waited = waited
            self.asked: list[tuple[float, float]] = []

        def waiting_during(self, start: float, end: float) -> WaitSummary | None:
            self.asked.append((start, end))
            return WaitSummary(2, ("needs 2 GPUs",)) if self.waited else None

        def free_while_waiting(self, since: float, until: float) -> list[tuple[int, float, list[int]]]:
            return [(T0, 1800.0, [4])]  # the queue's word: GPU 3 (row 4) free for half the hour while jobs waited

    waits = Waits(True)
    [hour] = build_report(store, T0, T0 + 2 * H, "gpu", now=T0 + 2 * H, waits=waits).unallocated_hours
    assert (hour.jobs_waiting, hour.wait_reasons, waits.asked) == (2, ("needs 2 GPUs",), [(T0, T0 + H)])
    assert (hour.unallocated_gpu_hours, hour.gpus) == (0.5, ("3",))
    assert build_report(store, T0, T0 + 2 * H, "gpu", now=T0 + 2 * H, waits=Waits(False)).unallocated_hours == ()


def test_a_window_cut_inside_hours_is_exact_to_the_minute_by_gpu(store: LedgerStore) -> None:
    since, until = T0 + 25 * 60, T0 + H + 50 * 60  # minutes, then hour rows, then minutes
    g = rows(store, since, until, "gpu")
    assert g["0"].observed_gpu_hours == (until - since) / H
    assert g["0"].busy_gpu_hours == pytest.approx(0.8 * (until - since) / H, abs=1e-12)
    assert g["3"].unqueued_gpu_hours == 50 / 60
    # by job the window is widened to whole hours
    assert rows(store, since, until, "job")["1"].allocated_gpu_hours == 4.0


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (25 * 60 + 20, 26 * 60 + 50),  # inside two minutes
        (10 * 60 + 15, 10 * 60 + 45),  # inside one minute
        (59 * 60 + 30, H + 30),  # across the hour, cutting a minute on each side
        (25 * 60 + 20, H + 50 * 60 + 10),  # minutes cut, whole minutes, an hour, minutes, a minute cut
    ],
)
def test_a_window_that_cuts_minutes_counts_their_share_by_gpu(store: LedgerStore, start: int, end: int) -> None:
    since, until = T0 + start, T0 + end
    g = rows(store, since, until, "gpu")
    # GPU 0 is held and 80% busy the whole time: every figure follows the window to the second
    assert g["0"].observed_gpu_hours == pytest.approx((until - since) / H, abs=1e-6)
    assert g["0"].allocated_gpu_hours == pytest.approx((until - since) / H, abs=1e-6)
    assert g["0"].busy_gpu_hours == pytest.approx(0.8 * (until - since) / H, abs=1e-6)
    assert g["0"].calendar_gpu_hours == pytest.approx(g["0"].observed_gpu_hours, abs=1e-6)


def test_bad_arguments_are_one_clear_error(store: LedgerStore) -> None:
    with pytest.raises(ValueError, match="--by must be one of"):
        build_report(store, T0, T0 + H, "team")
    with pytest.raises(ValueError, match="later than"):
        build_report(store, T0, T0, "gpu")
    with pytest.raises(ValueError, match="prices"):
        build_report(store, T0, T0 + H, "gpu", prices=Prices(per_gpu_hour=-1.0))


def test_mig_instances_carry_the_work_and_their_card_the_calendar(tmp_path: Path) -> None:
    def mig(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        card = gpu("GPU-0", 0, power_w=360.0)
        a = gpu("MIG-a", 0, mig_instance=1, sm_active=50.0)
        b = gpu("MIG-b", 0, mig_instance=2, sm_active=0.0)
        return snap(t, [card, a, b], [proc(1, "MIG-a", job_id=1)]), [job(1, "MIG-a")]

    store = recorded(tmp_path, mig, T0, T0 + H)
    report = build_report(store, T0, T0 + H, "gpu", prices=Prices(per_gpu_hour=2.0), now=T0 + H)
    g = {r.group: r for r in report.rows}
    assert list(g) == ["0", "0/1", "0/2"]
    assert g["0"].gpu_hour_cost == 2.0 and g["0"].energy_kwh == pytest.approx(0.36, abs=1e-12)
    assert g["0/1"].gpu_hour_cost is None and g["0/1"].cost is None and g["0/1"].allocated_gpu_hours == 1.0
    assert g["0/1"].busy_source == "sm_active" and g["0/1"].busy_gpu_hours == 0.5
    assert report.total.calendar_gpu_hours == 1.0 and report.total.gpu_hour_cost == 2.0
    [hour] = report.unallocated_hours  # the idle instance, not the card
    assert hour.gpus == ("0/2",) and hour.unallocated_gpu_hours == 1.0
    # two instances may hold more GPU-hours than their card's calendar: the text report says why
    assert any("MIG instance counts as a GPU of its own" in n for n in notes(report))


def test_no_mig_note_without_mig_instances(store: LedgerStore) -> None:
    report = build_report(store, T0, T0 + H, "gpu", now=T0 + H)
    assert not any("MIG instance" in n for n in notes(report))


def test_a_series_per_gpu_for_the_chart(store: LedgerStore) -> None:
    hourly = {s.label: s for s in gpu_series(store, T0, T0 + 2 * H, 3600)}
    assert list(hourly) == ["0", "1", "2", "3"]
    assert [(p.start, p.allocated_s, p.busy_share) for p in hourly["0"].points] == [
        (T0, 3600, 0.8),
        (T0 + H, 3600, 0.8),
    ]
    assert [p.allocated_s for p in hourly["3"].points] == [0.0, 0.0]
    quarter = {s.label: s for s in gpu_series(store, T0 + 10 * 60, T0 + H, 15 * 60)}["1"].points
    assert [p.start for p in quarter] == [T0, T0 + 900, T0 + 1800, T0 + 2700]  # the first step from T0 + 10 min
    assert quarter[0].observed_s == 300 and quarter[1].observed_s == 900
    with pytest.raises(ValueError, match="whole number of minutes"):
        gpu_series(store, T0, T0 + H, 90)


def test_a_window_past_the_last_write_says_what_is_recorded_so_far(store: LedgerStore) -> None:
    live = build_report(store, T0 + H, T0 + 2 * H + 30, "gpu", now=T0 + 2 * H + 30)
    assert not live.recording_stale
    assert any(n.startswith("recorded up to ") for n in notes(live))
    done = build_report(store, T0 + H, T0 + 2 * H, "gpu", now=T0 + 2 * H + 30)
    assert not any(n.startswith("recorded up to ") for n in notes(done))


def test_a_window_before_the_ledger_begins_says_so(store: LedgerStore) -> None:
    before = build_report(store, T0 - 30 * 86400, T0 - 29 * 86400, "gpu", now=T0 + 2 * H)
    assert before.recorded_from == T0 and before.rows == ()
    assert any(n.startswith("the ledger begins at ") for n in notes(before))
    inside = build_report(store, T0, T0 + H, "gpu", now=T0 + 2 * H)
    assert not any(n.startswith("the ledger begins") for n in notes(inside))


def test_unallocated_hours_list_a_gpu_without_an_index_last_as_the_chart_does() -> None:
    from gpubox.ledger.findings import _label_order

    assert sorted(["?", "1", "0/2", "10", "0"], key=_label_order) == ["0", "0/2", "1", "10", "?"]
