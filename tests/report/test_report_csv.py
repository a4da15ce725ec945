"""The CSV is for spreadsheets: a MIG label stays text (never a date), text never runs as a
formula, and figures stay numbers."""

from __future__ import annotations

import csv
import io
from dataclasses import fields, replace
from typing import Any

from gpubox.cli.report_view import write_csv
from gpubox.ledger.report import UsageRow

EMPTY: dict[str, Any] = {f.name: None for f in fields(UsageRow)}
ROW = UsageRow(**EMPTY | {"group": "total", "allocated_gpu_hours": 0.0, "loader_wait_known_gpu_hours": 0.0})


def records(*rows: UsageRow) -> list[dict[str, str]]:
    out = io.StringIO()
    write_csv(rows, out)
    return list(csv.DictReader(io.StringIO(out.getvalue())))


def test_gpu_labels_are_text_a_spreadsheet_keeps() -> None:
    mig = replace(ROW, group="1/5", gpu_uuid="MIG-x", gpu_index=1, mig_instance=5, calendar_gpu_hours=2.5)
    card = replace(ROW, group="1", gpu_uuid="GPU-x", gpu_index=1)
    found = records(card, mig, ROW)
    assert [r["group"] for r in found] == ["gpu 1", "gpu 1/5", "total"]  # "1/5" alone reads as 1 May
    assert (found[1]["gpu_index"], found[1]["mig_instance"], found[1]["calendar_gpu_hours"]) == ("1", "5", "2.5")


def test_text_that_would_run_as_a_formula_is_quoted_and_figures_stay_numbers() -> None:
    risky = ['=HYPERLINK("http://x","y")', "+1", "-lr 3e-4", "@SUM(A1)", "\tx"]
    rows = [
        replace(ROW, group=str(i), job_id=i, job_name=name, user="alice", tag="team=vision", busy_gpu_hours=-0.0)
        for i, name in enumerate(risky)
    ]
    found = records(*rows)
    assert [r["job_name"] for r in found] == ["'" + name for name in risky]
    assert {(r["user"], r["tag"]) for r in found} == {("alice", "team=vision")}  # harmless text as it is
    assert [r["job_id"] for r in found] == ["0", "1", "2", "3", "4"]
    # a figure is written as a number, even one that starts with a minus
    assert found[0]["busy_gpu_hours"] == "-0.0" and found[0]["allocated_gpu_hours"] == "0.0"
