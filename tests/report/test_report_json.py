"""`gpubox report --json` over a ledger of known hours: every figure, by every grouping, equals
what was recorded, and prices come from the flags, else the config."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from typing import Any

import pytest

from gpubox.ledger.report import UsageRow
from tests.ledger.builders import T0
from tests.report.conftest import Box

H = 3600
PRICES = ("--price-per-gpu-hour", "2", "--price-per-kwh", "0.5")


def rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["group"]: r for r in doc["data"]["rows"]}


def test_by_gpu_hours_energy_and_costs(recorded: Box) -> None:
    doc = recorded.report_json(*PRICES)
    assert (doc["schema"], doc["command"], doc["ok"], doc["exit_code"], doc["errors"]) == (1, "report", True, 0, [])
    data = doc["data"]
    assert (data["since"], data["until"], data["by"], data["tag_key"]) == (T0, T0 + 2 * H, "gpu", None)
    assert (data["price_per_gpu_hour"], data["price_per_kwh"]) == (2.0, 0.5)
    g = rows(doc)
    assert list(g) == ["0", "1"]
    g0, g1 = g["0"], g["1"]
    assert (g0["calendar_gpu_hours"], g0["allocated_gpu_hours"], g0["busy_gpu_hours"]) == (2.0, 2.0, 1.5)
    assert (g0["idle_allocated_gpu_hours"], g0["starved_gpu_hours"], g0["busy_source"]) == (0.5, 0.4, "gpu_busy")
    assert g0["energy_kwh"] == pytest.approx(0.6) and g0["cost"] == pytest.approx(4.0 + 0.3)
    assert (g1["calendar_gpu_hours"], g1["allocated_gpu_hours"], g1["busy_gpu_hours"]) == (2.0, 1.0, 0.5)
    assert g1["starved_gpu_hours"] is None  # job 2's loader wait was never known: null, not 0
    assert g1["energy_kwh"] == pytest.approx(0.3) and g1["cost"] == pytest.approx(4.0 + 0.15)
    total = data["total"]
    assert (total["group"], total["calendar_gpu_hours"], total["allocated_gpu_hours"]) == ("total", 4.0, 3.0)
    assert (total["busy_gpu_hours"], total["idle_allocated_gpu_hours"]) == (2.0, 1.0)
    assert total["cost"] == pytest.approx(8.45) and total["gpu_hour_cost"] == 8.0
    assert data["gpu_count"] == 2 and data["gpu_total"] == total
    assert data["recorded_until"] == T0 + 2 * H


def test_every_row_has_every_field_with_explicit_nulls(recorded: Box) -> None:
    names = [f.name for f in fields(UsageRow)]
    for by in ("gpu", "job", "kind", "tag", "user"):
        data = recorded.report_json("--by", by)["data"]
        for row in [*data["rows"], data["total"], data["gpu_total"]]:
            assert list(row) == names, by
        assert data["total"]["cost"] is None  # no price: no cost, not 0


def test_findings_that_pay(recorded: Box) -> None:
    data = recorded.report_json()["data"]
    idle = [(a["job_id"], a["idle_allocated_gpu_hours"]) for a in data["idle_attempts"]]
    assert idle == [(1, 0.5), (2, 0.5)]
    [starved] = data["starved_attempts"]
    assert (starved["job_id"], starved["starved_gpu_hours"], starved["tags"]) == (
        1,
        0.4,
        {"project": "p1", "team": "vision"},
    )
    # GPU 1 sat unallocated the second hour, but no job waited then: nothing was lost to the queue.
    assert data["unallocated_hours"] == []


def test_by_job_costs_the_allocated_hours(recorded: Box) -> None:
    doc = recorded.report_json("--by", "job", *PRICES)
    j = rows(doc)
    assert list(j) == ["1", "2"]
    one, two = j["1"], j["2"]
    assert (one["job_id"], one["job_name"], one["kind"], one["user"], one["attempts"]) == (
        1,
        "job1",
        "train",
        "alice",
        1,
    )
    assert (one["allocated_gpu_hours"], one["busy_gpu_hours"], one["starved_gpu_hours"]) == (2.0, 1.5, 0.4)
    assert one["peak_gpu_mem_bytes"] == 8 << 30
    assert one["cost"] == pytest.approx(2 * 2.0 + 0.6 * 0.5)
    assert (two["allocated_gpu_hours"], two["idle_allocated_gpu_hours"], two["starved_gpu_hours"]) == (1.0, 0.5, None)
    assert two["energy_kwh"] == pytest.approx(0.15) and two["cost"] == pytest.approx(2.0 + 0.075)
    data = doc["data"]
    assert data["total"]["allocated_gpu_hours"] == 3.0 and data["total"]["calendar_gpu_hours"] is None
    assert data["gpu_total"]["calendar_gpu_hours"] == 4.0  # the calendar, whatever the grouping


def test_by_kind_tag_and_user(recorded: Box) -> None:
    kinds = rows(recorded.report_json("--by", "kind"))
    assert {k: r["allocated_gpu_hours"] for k, r in kinds.items()} == {"train": 2.0, "infer": 1.0}
    pairs = rows(recorded.report_json("--by", "tag"))
    assert {k: r["allocated_gpu_hours"] for k, r in pairs.items()} == {
        "team=vision": 2.0,
        "project=p1": 2.0,
        "team=speech": 1.0,
    }
    teams = recorded.report_json("--by", "tag", "--tag", "team")
    assert teams["data"]["tag_key"] == "team"
    assert {k: r["allocated_gpu_hours"] for k, r in rows(teams).items()} == {"team=vision": 2.0, "team=speech": 1.0}
    assert rows(recorded.report_json("--tag", "team")) == rows(teams)  # --tag alone groups by tag
    users = rows(recorded.report_json("--by", "user"))
    assert {u: (r["allocated_gpu_hours"], r["busy_gpu_hours"]) for u, r in users.items()} == {
        "alice": (2.0, 1.5),
        "bob": (1.0, 0.5),
    }


def test_prices_from_the_config_and_flags_over_them(recorded: Box) -> None:
    config = {"GPUBOX_REPORT_GPU_HOUR_PRICE": "3", "GPUBOX_REPORT_KWH_PRICE": "1"}
    data = recorded.report_json(env=config)["data"]
    assert (data["price_per_gpu_hour"], data["price_per_kwh"]) == (3.0, 1.0)
    assert data["total"]["cost"] == pytest.approx(4 * 3.0 + 0.9)
    data = recorded.report_json("--price-per-gpu-hour", "1.5", env=config)["data"]
    assert (data["price_per_gpu_hour"], data["price_per_kwh"]) == (1.5, 1.0)
    assert data["total"]["cost"] == pytest.approx(4 * 1.5 + 0.9)


def test_a_window_in_durations_ago_reaches_the_recorded_hours(recorded: Box) -> None:
    days = int((time.time() - T0) // 86400) + 1
    result = recorded.report("--json", "--since", f"{days}d", "--until", "now")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert rows({"data": data})["0"]["allocated_gpu_hours"] == 2.0
    assert data["recording_stale"] is True  # nothing recorded since then: the report says so


def test_window_outside_the_recording_is_zero_not_an_error(recorded: Box) -> None:
    later = "2030-01-01T00:00+00:00"
    result = recorded.report("--json", "--since", later, "--until", "2030-01-02T00:00+00:00")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["total"]["allocated_gpu_hours"] == 0.0
    assert data["idle_attempts"] == [] and data["unallocated_hours"] == []
