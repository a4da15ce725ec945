"""The transfer arithmetic and verdicts, with injected timings: known bytes and seconds give exact
rates and shares of the link; no benchmark runs here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from gpubox.doctor.gpu_specs import gpu_spec
from gpubox.doctor.model import LinkSample
from gpubox.doctor.thresholds import Thresholds
from gpubox.doctor.transfer import (
    LANE_GB_PER_S,
    NOT_MEASURED,
    PcieLink,
    TransferResult,
    copy_window,
    failed_transfer,
    link_under_load,
    transfer_result,
)
from gpubox.doctor.transfer_checks import transfer_checks

GB = 1_000_000_000
T = Thresholds()
GEN4_X16 = PcieLink(4, 16)
GEN5_X16 = PcieLink(5, 16)


def answer(
    *,
    name: str = "NVIDIA H200",
    nbytes: int = GB,
    h2d_pinned: float = 0.02,
    d2h_pinned: float = 0.02,
    h2d_pageable: float = 0.04,
    d2h_pageable: float = 0.04,
    d2d: float = 0.001,
    matmul: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """torch_bench.py transfer's answer, with every repetition taking the given seconds."""

    def timed(seconds: float, timer: str) -> dict[str, Any]:
        return {"bytes": nbytes, "seconds": [seconds] * 10, "timer": timer, "error": None}

    return {
        "kind": "transfer",
        "error": None,
        "torch_version": "2.5.1+cu124",
        "device": {"index": 0, "name": name, "capability": [9, 0]},
        "affinity": {"requested": [0, 1], "cpus": [0, 1], "applied": True, "error": None},
        "bytes": nbytes,
        "copies": {
            "h2d_pinned": timed(h2d_pinned, "cuda_event"),
            "d2h_pinned": timed(d2h_pinned, "cuda_event"),
            "h2d_pageable": timed(h2d_pageable, "wall"),
            "d2h_pageable": timed(d2h_pageable, "wall"),
            "d2d": timed(d2d, "cuda_event"),
        },
        "matmul": matmul,
    }


def by_id(result: TransferResult, t: Thresholds = T) -> dict[str, Any]:
    return {c.id: c for c in transfer_checks(result, t)}


def test_link_rates_per_direction_after_encoding() -> None:
    assert PcieLink(1, 16).gb_per_s == pytest.approx(4.0)
    assert PcieLink(2, 16).gb_per_s == pytest.approx(8.0)
    assert PcieLink(3, 16).gb_per_s == pytest.approx(15.754, abs=1e-3)
    assert GEN4_X16.gb_per_s == pytest.approx(31.508, abs=1e-3)
    assert GEN5_X16.gb_per_s == pytest.approx(63.015, abs=1e-3)
    assert PcieLink(6, 16).gb_per_s == pytest.approx(121.0)
    assert LANE_GB_PER_S[4] == pytest.approx(1.969, abs=1e-3)
    assert PcieLink(7, 16).gb_per_s is None
    assert PcieLink.of(None, 16) is None and PcieLink.of(4, 0) is None


def test_known_bytes_and_seconds_give_exact_rates_and_shares() -> None:
    result = transfer_result(answer(h2d_pinned=0.04), gpu=0, link_now=GEN4_X16, link_max=GEN4_X16)
    copy = result.h2d_pinned
    assert copy.median_s == pytest.approx(0.04)
    assert copy.gb_per_s == pytest.approx(25.0)
    assert copy.link_gb_per_s == pytest.approx(16 * 16 * 128 / 130 / 8)
    assert copy.link_fraction == pytest.approx(25.0 / (16 * 16 * 128 / 130 / 8))
    assert copy.reps == 10 and copy.timer == "cuda_event" and copy.bytes == GB
    check = by_id(result)["transfer.h2d_pinned"]
    assert check.status == "ok" and check.value == 25.0 and check.unit == "GB/s"
    assert "25.0 GB/s" in check.detail and "79%" in check.detail and "Gen4 x16" in check.detail


def test_the_median_ignores_one_slow_repetition() -> None:
    data = answer()
    data["copies"]["h2d_pinned"]["seconds"] = [0.02, 0.02, 0.5, 0.02, 0.03]
    result = transfer_result(data, gpu=0)
    assert result.h2d_pinned.median_s == pytest.approx(0.02)
    assert result.h2d_pinned.max_s == pytest.approx(0.5) and result.h2d_pinned.min_s == pytest.approx(0.02)


def test_copies_are_judged_against_the_link_they_ran_on() -> None:
    # 12 GB/s: 76% of the Gen4 x8 it ran at (fine for that link), 19% of the Gen5 x16 that GPU and slot
    # allow: the link is pcie.link's finding, so the copy is not a second one.
    result = transfer_result(answer(h2d_pinned=1 / 12), gpu=3, link_now=PcieLink(4, 8), link_max=GEN5_X16)
    assert result.h2d_pinned.link_fraction == pytest.approx(12 / PcieLink(4, 8).gb_per_s)  # type: ignore[operator]
    assert result.h2d_pinned.link_max_fraction == pytest.approx(12 / GEN5_X16.gb_per_s)  # type: ignore[operator]
    check = by_id(result)["transfer.h2d_pinned"]
    assert check.status == "ok" and check.gpu == 3 and check.impact == 0.0
    assert "76% of the 15.8 GB/s a Gen4 x8 link carries" in check.detail
    assert "19% of the 63.0 GB/s at Gen5 x16, see pcie.link" in check.detail
    assert check.evidence["link_under_load"] == "Gen4 x8" and check.evidence["link_max"] == "Gen5 x16"


def test_a_slow_copy_on_a_downtrained_link_points_at_the_link() -> None:
    # 5 GB/s: 32% of the Gen4 x8 it ran at
    result = transfer_result(answer(h2d_pinned=1 / 5), gpu=3, link_now=PcieLink(4, 8), link_max=GEN5_X16)
    check = by_id(result)["transfer.h2d_pinned"]
    assert check.status == "fail" and "ran at Gen4 x8 under load" in check.detail
    assert check.fix is not None and "Reseat" in check.fix
    assert check.impact == pytest.approx(0.5 * (1 - 5 / PcieLink(4, 8).gb_per_s), abs=1e-3)  # type: ignore[operator]


def test_a_slow_copy_on_a_full_speed_link_points_at_the_host() -> None:
    result = transfer_result(answer(h2d_pinned=1 / 20), gpu=0, link_now=GEN5_X16, link_max=GEN5_X16)
    check = by_id(result)["transfer.h2d_pinned"]
    assert check.status == "fail"  # 20 / 63 = 32%
    assert "ran at its best" in check.detail
    assert check.fix is not None and "iommu=pt" in check.fix and "Reseat" not in check.fix


def test_the_warn_and_fail_bands_follow_the_thresholds() -> None:
    # 35 GB/s on Gen5 x16: 56%, between the fail (40%) and warn (70%) lines
    result = transfer_result(answer(d2h_pinned=1 / 35), gpu=0, link_now=GEN5_X16, link_max=GEN5_X16)
    assert by_id(result)["transfer.d2h_pinned"].status == "warn"
    assert by_id(result, Thresholds(transfer_warn_fraction=0.5))["transfer.d2h_pinned"].status == "ok"
    assert by_id(result, Thresholds(transfer_fail_fraction=0.6))["transfer.d2h_pinned"].status == "fail"


def test_without_the_link_there_is_a_figure_but_no_verdict() -> None:
    check = by_id(transfer_result(answer(), gpu=0))["transfer.h2d_pinned"]
    assert check.status == "ok" and check.value == 50.0 and "no verdict" in check.detail


def test_only_the_maximum_known_is_enough_for_a_verdict() -> None:
    check = by_id(transfer_result(answer(h2d_pinned=1 / 10), gpu=0, link_max=GEN5_X16))["transfer.h2d_pinned"]
    assert check.status == "fail" and "ran at" not in check.detail


def test_pageable_against_pinned_is_a_figure_with_the_advice_not_a_fault() -> None:
    # Pageable copies are slower on every box: the figure and what pinning would give, not a warning.
    result = transfer_result(answer(h2d_pinned=1 / 25, h2d_pageable=1 / 10), gpu=0, link_now=GEN4_X16)
    check = by_id(result)["transfer.pageable"]
    assert check.status == "ok" and check.value == 40.0 and check.unit == "%" and check.fix is None
    assert "pin_memory=True" in check.meaning and "non_blocking=True" in check.meaning
    assert "10.0 GB/s" in check.detail and "25.0 GB/s" in check.detail
    assert check.impact == 0.0


def test_device_to_device_counts_memory_traffic_twice() -> None:
    # 1 GB in 1 ms: 1,000 GB/s copied, 2,000 GB/s of traffic against the H200's 4,800 GB/s
    result = transfer_result(answer(d2d=0.001), gpu=0)
    assert result.d2d.gb_per_s == pytest.approx(1000.0)
    assert result.d2d.traffic_gb_per_s == pytest.approx(2000.0)
    assert result.d2d.memory_gb_per_s == 4800
    assert result.d2d.memory_fraction == pytest.approx(2000 / 4800)
    check = by_id(result)["transfer.d2d"]
    assert check.status == "warn" and "42%" in check.detail and "H200 SXM" in check.detail
    fast = by_id(transfer_result(answer(d2d=0.0005), gpu=0))["transfer.d2d"]
    assert fast.status == "ok" and "83%" in fast.detail


def test_matmul_rate_against_the_dense_peak() -> None:
    n = 8192
    flops = 2 * n**3 * 10
    matmul = {"n": n, "dtype": "bfloat16", "matmuls_per_rep": 10, "flops": flops, "seconds": [flops / 700e12] * 10}
    result = transfer_result(answer(matmul=matmul), gpu=0)
    assert result.matmul.tflops == pytest.approx(700.0)
    assert result.matmul.peak_tflops == pytest.approx(989.4)
    assert result.matmul.peak_fraction == pytest.approx(700 / 989.4)
    check = by_id(result)["transfer.matmul"]
    assert check.status == "ok" and check.value == 700.0 and "71%" in check.detail
    slow = dict(matmul, seconds=[flops / 200e12] * 10)
    warned = by_id(transfer_result(answer(matmul=slow), gpu=0))["transfer.matmul"]
    assert warned.status == "warn" and warned.fix is not None and "clock" in warned.meaning


def test_fp16_matmul_uses_the_fp16_peak() -> None:
    matmul = {"n": 4096, "dtype": "float16", "flops": 10**15, "seconds": [10.0]}
    result = transfer_result(answer(name="Tesla V100-SXM2-32GB", matmul=matmul), gpu=0)
    assert result.matmul.tflops == pytest.approx(100.0)
    assert result.matmul.peak_tflops == 125.0


def test_an_unknown_gpu_has_explicit_nulls() -> None:
    matmul = {"n": 1024, "dtype": "bfloat16", "flops": 10**12, "seconds": [0.01] * 10}
    result = transfer_result(answer(name="NVIDIA Mystery 9000", matmul=matmul), gpu=1)
    assert result.d2d.memory_gb_per_s is None and result.d2d.memory_fraction is None
    assert result.matmul.peak_tflops is None and result.matmul.peak_fraction is None
    data = json.loads(json.dumps(result.as_json()))
    assert data["d2d"]["memory_fraction"] is None and "peak_fraction" in data["matmul"]
    checks = by_id(result)
    assert checks["transfer.d2d"].status == "ok" and "not in gpubox's table" in checks["transfer.d2d"].detail
    assert checks["transfer.matmul"].status == "ok" and "no bfloat16 peak" in checks["transfer.matmul"].detail


def test_every_key_is_present_when_nothing_was_measured() -> None:
    result = failed_transfer("torch is not installed in /venv/bin/python", gpu=2)
    data = json.loads(json.dumps(result.as_json()))
    assert data["error"] == "torch is not installed in /venv/bin/python"
    assert set(data) >= {"h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable", "d2d", "matmul", "link_now"}
    assert data["h2d_pinned"]["gb_per_s"] is None and data["h2d_pinned"]["link_fraction"] is None
    checks = transfer_checks(result, T)
    assert [c.id for c in checks] == [
        "transfer.h2d_pinned",
        "transfer.d2h_pinned",
        "transfer.pageable",
        "transfer.d2d",
        "transfer.matmul",
    ]
    assert all(c.status == "skip" and c.gpu == 2 and "torch is not installed" in c.detail for c in checks)


def test_a_matmul_not_asked_for_is_a_skip_that_says_so() -> None:
    check = by_id(transfer_result(answer(), gpu=0))["transfer.matmul"]
    assert check.status == "skip" and check.detail == NOT_MEASURED


def test_a_failed_measurement_keeps_its_own_reason() -> None:
    data = answer()
    data["copies"]["h2d_pinned"] = {"seconds": [], "timer": None, "error": "OutOfMemoryError: CUDA out of memory."}
    data["copies"]["d2d"]["seconds"] = [0.001, -1.0]
    result = transfer_result(data, gpu=0, link_now=GEN4_X16)
    checks = by_id(result)
    assert checks["transfer.h2d_pinned"].status == "skip" and "out of memory" in checks["transfer.h2d_pinned"].detail
    assert checks["transfer.pageable"].status == "skip"
    assert checks["transfer.d2d"].status == "skip" and "unusable timings" in checks["transfer.d2d"].detail
    assert checks["transfer.d2h_pinned"].status == "ok"


def test_the_link_under_load_is_the_fastest_seen_in_the_window() -> None:
    def sample(at: float, gen: int | None, width: int | None, gpu: int = 0) -> LinkSample:
        return LinkSample(at=at, gpu=gpu, pcie_gen=gen, pcie_width=width, clock_event_reasons=0, pcie_replay_count=0)

    samples = [
        sample(1.0, 1, 16),  # idle, before the copies
        sample(2.0, 1, 16),  # still waking up
        sample(2.1, 5, 16),
        sample(2.2, None, None),
        sample(2.3, 5, 16, gpu=1),
        sample(9.0, 5, 16),  # after the window
    ]
    assert link_under_load(samples, 0, since=1.5, until=3.0) == GEN5_X16
    assert link_under_load(samples[:2], 0) == PcieLink(1, 16)
    assert link_under_load(samples, 2) is None
    assert link_under_load([sample(2.0, 4, 8), sample(2.1, 4, 16), sample(2.2, 3, 16)], 0) == GEN4_X16


@pytest.mark.parametrize(
    ("name", "label", "memory", "bf16"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350, 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000, 756.5),
        ("NVIDIA H100 NVL", "H100 NVL", 3900, 835.5),
        ("NVIDIA H200", "H200 SXM", 4800, 989.4),
        ("NVIDIA H200 NVL", "H200 NVL", 4800, 835.5),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039, 312.0),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935, 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555, 312.0),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555, 312.0),
        ("NVIDIA L40S", "L40S", 864, 362.05),
        ("NVIDIA L40", "L40", 864, 181.05),
        ("NVIDIA L4", "L4", 300, 121.0),
        ("NVIDIA A10", "A10", 600, 125.0),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", 1008, 165.2),
        ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090", 936, 71.0),
        ("NVIDIA RTX A6000", "RTX A6000", 768, 154.8),
        ("Tesla V100-SXM2-16GB", "V100 SXM2", 900, None),
        ("Tesla T4", "T4", 320, None),
    ],
)
def test_gpu_specs_by_reported_name(name: str, label: str, memory: float, bf16: float | None) -> None:
    spec = gpu_spec(name)
    assert spec is not None and (spec.label, spec.memory_gb_per_s, spec.bf16_tflops) == (label, memory, bf16)


@pytest.mark.parametrize(
    "name", ["NVIDIA A10G", "NVIDIA GH200 480GB", "NVIDIA H20", "NVIDIA GeForce RTX 4080", "", None]
)
def test_gpus_not_in_the_table_have_no_spec(name: str | None) -> None:
    assert gpu_spec(name) is None


def test_limits_the_thresholds_carry_replace_the_defaults() -> None:
    @dataclass(frozen=True)
    class Stricter(Thresholds):
        matmul_warn_fraction: float = 0.8

    flops = 10**15
    matmul = {"n": 8192, "dtype": "bfloat16", "flops": flops, "seconds": [flops / 700e12]}
    result = transfer_result(answer(matmul=matmul, h2d_pinned=1 / 25, h2d_pageable=1 / 20), gpu=0)
    assert by_id(result)["transfer.matmul"].status == "ok"  # 71% of peak
    assert by_id(result, Stricter())["transfer.matmul"].status == "warn"


def test_the_copy_window_spans_every_copy() -> None:
    data = answer()
    for i, copy in enumerate(data["copies"].values()):
        copy["started_at"], copy["ended_at"] = 100.0 + i, 100.5 + i
    data["copies"]["d2d"]["started_at"] = None  # a copy that failed has no times
    assert copy_window(data) == (100.0, 104.5)
    assert copy_window({"copies": {}}) is None and copy_window({}) is None
