"""Ranking, the summary line, the exit code and the time limit on a group of checks."""

from __future__ import annotations

import threading

import pytest

from gpubox.doctor.findings import exit_code, make_report, rank, summary_line
from gpubox.doctor.guard import TimedOut, guarded, within
from gpubox.doctor.model import Check, skipped
from gpubox.envelope import envelope
from gpubox.exit_codes import ExitCode


def check(id: str, status: str, impact: float = 0.0, category: str = "host", gpu: int | None = None) -> Check:
    return Check(id=id, title=id, category=category, status=status, detail=f"{id} detail", impact=impact, gpu=gpu)  # type: ignore[arg-type]


def test_failures_come_before_warnings_and_impact_orders_each() -> None:
    checks = [
        check("a", "warn", 0.9),
        check("b", "ok"),
        check("c", "fail", 0.1),
        check("d", "fail", 0.5),
        check("e", "skip"),
        check("f", "warn", 0.2),
    ]
    assert [c.id for c in rank(checks)] == ["d", "c", "a", "f"]


def test_equal_impact_goes_by_category_then_gpu() -> None:
    checks = [check("x", "warn", 0.3, "loader"), check("y", "warn", 0.3, "driver"), check("z", "warn", 0.3, "pcie", 1)]
    checks.append(check("z", "warn", 0.3, "pcie", 0))
    assert [(c.id, c.gpu) for c in rank(checks)] == [("y", None), ("z", 0), ("z", 1), ("x", None)]


def test_summary_names_the_tally_and_the_first_finding() -> None:
    checks = [check("host.shm", "fail", 0.8), check("b", "ok"), check("c", "warn"), skipped("d", "d", "gpu", "no GPU")]
    line = summary_line(checks, rank(checks))
    assert line.startswith("1 failed, 1 warning, 1 ok, 1 skipped. First: host.shm: host.shm detail")
    gpu_line = summary_line([check("pcie.link", "fail", gpu=7)], rank([check("pcie.link", "fail", gpu=7)]))
    assert "GPU 7: pcie.link" in gpu_line
    assert summary_line([check("b", "ok")], ()) == "0 failed, 0 warnings, 1 ok, 0 skipped: nothing to fix"
    assert summary_line([skipped("d", "d", "gpu", "no GPU")], ()).endswith("nothing could be checked")


def test_exit_code_table() -> None:
    assert exit_code([check("a", "ok"), check("b", "warn")], False) == ExitCode.OK
    assert exit_code([check("a", "fail")], False) == ExitCode.CHECK_FAILED == 5
    assert exit_code([check("a", "ok")], True) == ExitCode.NO_GPU == 3


def test_report_json_has_every_key_with_explicit_nulls() -> None:
    report = make_report("doctor", "quick", [check("a", "fail", 0.5), check("b", "ok")], {"transfer": None})
    doc = envelope("doctor", report, code=ExitCode.CHECK_FAILED)
    data = doc["data"]
    assert set(data) == {
        "command", "mode", "summary", "counts", "findings", "checks", "benchmarks", "facts", "took_s", "notes"
    }  # fmt: skip
    assert data["benchmarks"] == {"transfer": None}
    assert data["counts"] == {"ok": 1, "warn": 0, "fail": 1, "skip": 0}
    first = data["findings"][0]
    assert first["id"] == "a" and first["value"] is None and first["fix"] is None and first["gpu"] is None
    assert set(first) == set(data["checks"][1])


def test_within_returns_raises_and_times_out() -> None:
    assert within(1.0, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        within(1.0, lambda: 1 // 0)
    release = threading.Event()
    with pytest.raises(TimedOut, match=r"within 0\.05 s"):
        within(0.05, release.wait)
    release.set()


def test_a_group_that_hangs_or_breaks_becomes_one_warning() -> None:
    release = threading.Event()

    def hang() -> list[Check]:
        release.wait()
        return []

    [hung] = guarded("gpu", "GPU health", "gpu", 0.05, hang)
    release.set()
    assert hung.status == "warn" and hung.id == "gpu.error" and "did not finish within 0.05 s" in hung.detail

    def broken() -> list[Check]:
        raise OSError("stale file handle")

    [failed] = guarded("data", "Dataset reads", "data", 1.0, broken)
    assert failed.status == "warn" and "OSError: stale file handle" in failed.detail and failed.fix
    assert guarded("host", "Host", "host", 1.0, lambda: [check("h", "ok")])[0].id == "h"
