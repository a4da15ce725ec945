"""`gpubox report` for people (summary, table, chart, findings) and as CSV for spreadsheets."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import fields, replace
from typing import Any

import pytest

from gpubox.cli.report_view import MAX_TABLE_ROWS, chart_step, shown_rows
from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import UsageRow
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, drive, gpu, proc, snap
from tests.report.conftest import SINCE, UNTIL, Box

WINDOW = ("--since", SINCE, "--until", UNTIL)


def text(box: Box, *args: str) -> str:
    result = box.report(*WINDOW, "--no-color", *args)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == ""
    return result.stdout


def test_summary_table_chart_and_findings(recorded: Box) -> None:
    out = text(recorded, "--price-per-gpu-hour", "2", "--price-per-kwh", "0.5")
    summary = out.splitlines()[0]
    assert summary.startswith("gpubox report: ")
    for part in (
        "(2h)",
        "2 GPUs",
        "4.00 calendar GPU-h, 75% allocated, 50% busy",
        "idle while allocated 1.00 GPU-h",
        "starved 0.40 GPU-h",
        "energy 0.900 kWh",
        "box cost 8.45",
    ):
        assert part in summary, (part, summary)
    assert "GPU-hours by gpu" in out
    total = next(line for line in out.splitlines() if line.lstrip("│ ").startswith("total"))
    assert "4.00" in total and "3.00" in total and "8.45" in total
    assert "Utilisation per GPU, one block per 1m" in out
    lines = out.splitlines()
    gpu0 = next(line for line in lines if line.startswith("0 ") and "▇" in line)
    assert gpu0 == "0 " + "▇" * 120  # 75% busy and held, every minute of the two hours
    gpu1 = next(line for line in lines if line.startswith("1 ") and "▅" in line)
    assert gpu1 == "1 " + "▅" * 60 + "▁" * 60  # half busy for an hour, then idle
    assert "Held GPUs idle longest" in out and "job 1 (job1) train, alice: 0.50 GPU-h idle of 2.00 held" in out
    assert "Most starved (waiting for data)" in out and "0.40 GPU-h starved of 2.00 held" in out
    assert "Hours when GPUs sat unallocated" not in out  # GPU 1 sat free, but no job waited for it
    assert "nothing recorded since" in out  # the recording stopped in the past


def test_a_window_older_than_the_minutes_kept_is_charted_by_the_hour(recorded: Box) -> None:
    with LedgerStore(recorded.state_dir / "ledger.db") as store:
        store.prune(T0 + 40 * 86400, keep_days=400, keep_minute_days=35)  # the minutes are gone, the hours kept
    out = text(recorded)
    assert "Utilisation per GPU, one block per 1h" in out
    lines = out.splitlines()
    assert "0 ▇▇" in lines and "1 ▅▁" in lines  # 75% busy both hours; half busy, then idle


@pytest.mark.parametrize(("days", "asked"), [(365, False), (1, True)], ids=["a-year", "a-day"])
def test_only_a_chart_that_could_take_steps_under_an_hour_looks_for_pruned_minutes(
    recorded: Box, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], days: int, asked: bool
) -> None:
    # Whether retention dropped minutes is a query over every hour of the window and its minutes:
    # a year's chart takes steps of hours or more anyway, and its report need not pay for it.
    import gpubox.ledger.series as series
    from gpubox.cli.report import ReportRequest, _print_human
    from gpubox.ledger.report import Prices

    calls: list[tuple[float, float]] = []
    real = series.shortest_step

    def counted(store: LedgerStore, since: float, until: float) -> int:
        calls.append((since, until))
        return real(store, since, until)

    monkeypatch.setattr(series, "shortest_step", counted)
    for key, value in recorded.env.items():
        monkeypatch.setenv(key, value)
    until = T0 + 2 * 3600
    _print_human(ReportRequest(until - days * 86400, until, "gpu", None, until), Prices(), False)
    assert "GPU-hours by gpu" in capsys.readouterr().out
    assert bool(calls) is asked


@pytest.mark.parametrize(
    ("by", "header", "row"),
    [("job", "job", "2"), ("kind", "kind", "infer"), ("tag", "tag", "team=speech"), ("user", "user", "bob")],
)
def test_each_grouping_has_its_table(recorded: Box, by: str, header: str, row: str) -> None:
    out = text(recorded, "--by", by)
    assert f"GPU-hours by {by}" in out
    assert any(line.lstrip("│ ").startswith(row) for line in out.splitlines()), out
    assert f"by {by}, every hour that overlaps the window counts whole" in out
    assert "Utilisation per GPU" in out  # the chart is per GPU whatever the grouping


@pytest.mark.parametrize(("by", "shown"), [("job", "x[/bold]y"), ("tag", "team=[/]"), ("user", "[red]eve")])
def test_names_that_look_like_markup_are_shown_as_written(box: Box, by: str, shown: str) -> None:
    """A job name, tag value or user is anyone's text: "[/]" in one once ended the report in a traceback."""
    odd = Allocation(1, 1, "train", ("GPU-0",), name="x[/bold]y", user="[red]eve", tags={"team": "[/]"})

    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        return snap(t, [gpu("GPU-0", 0, gpu_busy=50.0)], [proc(1, "GPU-0", user="[red]eve", job_id=1)]), [odd]

    with LedgerStore(box.state_dir / "ledger.db") as store:
        clock = Clock()
        recorder = Recorder(store, interval_s=5, clock=clock)
        drive(recorder, clock, scene, T0, T0 + 3600)
        recorder.close()
    out = text(box, "--by", by)
    assert any(shown in line.split() for line in out.splitlines()), out


def test_no_price_means_no_cost_in_the_summary(recorded: Box) -> None:
    summary = text(recorded).splitlines()[0]
    assert "cost" not in summary


def test_csv_has_the_header_and_one_line_per_row(recorded: Box) -> None:
    result = recorded.report(*WINDOW, "--csv", "--by", "job", "--price-per-gpu-hour", "2")
    assert result.returncode == 0, result.stderr
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == [f.name for f in fields(UsageRow)]
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["group"] for r in records] == ["1", "2"]
    assert float(records[0]["allocated_gpu_hours"]) == 2.0 and float(records[0]["cost"]) == 4.0
    assert records[1]["starved_gpu_hours"] == ""  # unknown: an empty cell, not 0
    assert records[0]["calendar_gpu_hours"] == ""


def test_csv_by_gpu(recorded: Box) -> None:
    result = recorded.report(*WINDOW, "--csv")
    assert result.returncode == 0, result.stderr
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["group"], float(r["calendar_gpu_hours"])) for r in records] == [("gpu 0", 2.0), ("gpu 1", 2.0)]


@pytest.mark.parametrize(
    ("hours", "step"),
    [(2, 60), (24, 900), (7 * 24, 7200), (30 * 24, 21600), (365 * 24, 604800), (10 * 365 * 24, 5 * 604800)],
)
def test_the_chart_step_fits_the_window_in_its_columns(hours: int, step: int) -> None:
    assert chart_step(0, hours * 3600, 120) == step
    assert chart_step(0, hours * 3600, 120) % 60 == 0  # gpu_series takes whole minutes


def test_a_long_table_shows_the_rows_that_held_the_most_in_order() -> None:
    empty: dict[str, Any] = {f.name: None for f in fields(UsageRow)}
    template = UsageRow(**empty | {"loader_wait_known_gpu_hours": 0.0})
    rows = [replace(template, group=str(i), allocated_gpu_hours=float(i % 7)) for i in range(MAX_TABLE_ROWS + 30)]
    shown = shown_rows(rows)
    assert len(shown) == MAX_TABLE_ROWS
    assert [int(r.group) for r in shown] == sorted(int(r.group) for r in shown)  # the report's order kept
    assert min(r.allocated_gpu_hours for r in shown) >= max(r.allocated_gpu_hours for r in rows if r not in shown)
    assert shown_rows(rows[:5]) == rows[:5]


@pytest.mark.parametrize("by", ["gpu", "job", "kind", "user"])
@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_a_narrow_terminal_leaves_columns_out_and_never_cuts_a_figure(recorded: Box, by: str, width: int) -> None:
    from rich.console import Console

    from gpubox.cli.report_view import hours, money, table
    from gpubox.ledger.report import Prices, build_report
    from gpubox.ledger.store import LedgerStore
    from tests.ledger.builders import T0
    from tests.report.conftest import H

    with LedgerStore(recorded.state_dir / "ledger.db", create=False) as store:
        report = build_report(store, T0, T0 + 2 * H, by, prices=Prices(per_gpu_hour=2.0), now=T0 + 2 * H)
    out = Console(width=width, record=True, no_color=True)
    with out.capture() as captured:
        out.print(table(report, width))
    rendered = captured.get()
    body = rendered.split("alloc: held by a job")[0]
    assert max(len(line.rstrip()) for line in body.splitlines()) <= width
    # the figures that always stay are whole: allocated, busy and cost of the total
    total = next(line for line in body.splitlines() if line.lstrip().startswith("total")).split()
    t = report.total
    assert {hours(t.allocated_gpu_hours), hours(t.busy_gpu_hours), money(t.cost)} <= set(total), total
    said = " ".join(rendered.split())
    if width >= 120:
        assert "left out" not in said
    elif width == 40:
        assert "left out for the terminal's width" in said
