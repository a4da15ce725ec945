"""MIG: the queue hands out whole cards, the telemetry lists the work under the card's instances.
A job holding a card is charged with the work on its instances, and the by-gpu total counts the
card's calendar, energy and PCIe once and its work once."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import build_report
from gpubox.ledger.series import gpu_series
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import T0, Clock, Scene, drive, gpu, job, open_store, proc, snap

H = 3600
GIB = 1 << 30


def recorded(tmp_path: Path, scene: Scene) -> LedgerStore:
    store = open_store(tmp_path)
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(recorder, clock, scene, T0, T0 + H)
    recorder.close()
    return store


def held_card(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
    """Job 1 holds card 0 by its UUID; its process runs on instance 1; instance 2 is idle. The card
    has figures of its own (busy, occupancy, power, PCIe) that its instances' must not add to."""
    card = gpu("GPU-0", 0, sm_active=60.0, sm_occupancy=40.0, power_w=360.0, pcie_tx_Bps=100.0, pcie_rx_Bps=100.0)
    a = gpu("MIG-a", 0, mig_instance=1, sm_active=50.0, sm_occupancy=30.0, power_w=100.0)
    b = gpu("MIG-b", 0, mig_instance=2, sm_active=0.0, sm_occupancy=10.0, power_w=100.0)
    other = gpu("GPU-1", 1, gpu_busy=20.0, sm_occupancy=80.0, power_w=100.0)  # a whole card, unallocated
    job_process = proc(1, "MIG-a", job_id=1, loader_wait=0.5, mem=GIB)
    return snap(t, [card, a, b, other], [job_process]), [job(1, "GPU-0")]


def test_a_job_holding_a_mig_card_is_charged_with_the_work_on_its_instances(tmp_path: Path) -> None:
    store = recorded(tmp_path, held_card)
    [attempt] = build_report(store, T0, T0 + H, "job", now=T0 + H).rows
    assert attempt.allocated_gpu_hours == 2.0  # both instances, each a GPU of its own; the card not again
    assert attempt.busy_gpu_hours == 0.5 and attempt.busy_source == "sm_active"
    assert attempt.starved_gpu_hours == 0.5  # instance 1's hour × loader_wait 0.5
    assert attempt.peak_gpu_mem_bytes == GIB
    users = {r.group: r for r in build_report(store, T0, T0 + H, "user", now=T0 + H).rows}
    assert list(users) == ["alice"] and users["alice"].unqueued_gpu_hours == 0.0  # nothing unqueued
    by_gpu = build_report(store, T0, T0 + H, "gpu", now=T0 + H)
    g = {r.group: r for r in by_gpu.rows}
    assert g["0/1"].allocated_gpu_hours == g["0/2"].allocated_gpu_hours == 1.0
    assert g["0/1"].starved_gpu_hours == 0.5 and g["0/1"].unqueued_gpu_hours == 0.0
    [hour] = by_gpu.unallocated_hours  # the idle instance of the held card is not unallocated
    assert hour.gpus == ("1",) and hour.unallocated_gpu_hours == 1.0


def test_the_by_gpu_total_counts_a_mig_card_once(tmp_path: Path) -> None:
    store = recorded(tmp_path, held_card)
    report = build_report(store, T0, T0 + H, "gpu", now=T0 + H)
    g, total = {r.group: r for r in report.rows}, report.total
    assert g["0"].busy_gpu_hours == pytest.approx(0.6)  # the card's own row keeps its own figures
    # work from the instances and whole cards, never the MIG card too
    assert total.busy_gpu_hours == pytest.approx(0.5 + 0.0 + 0.2)
    assert total.allocated_gpu_hours == g["0/1"].allocated_gpu_hours + g["0/2"].allocated_gpu_hours == 2.0
    assert total.starved_gpu_hours == 0.5 and total.unqueued_gpu_hours == 0.0
    assert total.idle_allocated_gpu_hours == pytest.approx(0.5 + 1.0)
    assert total.mean_sm_occupancy == pytest.approx((30.0 + 10.0 + 80.0) / 3)
    # time, energy and PCIe from the cards, never their instances
    assert total.calendar_gpu_hours == g["0"].calendar_gpu_hours + g["1"].calendar_gpu_hours == 2.0
    assert total.observed_gpu_hours == 2.0
    assert total.energy_kwh == pytest.approx(g["0"].energy_kwh + g["1"].energy_kwh)
    assert total.energy_kwh == pytest.approx(0.46)
    assert total.pcie_tx_bytes == g["0"].pcie_tx_bytes == 100 * H


def test_the_chart_lists_a_card_before_its_instances_instance_0_too(tmp_path: Path) -> None:
    def scene(t: float) -> tuple[BoxSnapshot, Iterable[Allocation]]:
        # Listed instances first, as a driver may list them: the order must come from the labels.
        parts = [gpu("MIG-1", 0, mig_instance=1), gpu("MIG-0", 0, mig_instance=0), gpu("GPU-0", 0), gpu("GPU-1", 1)]
        return snap(t, parts, []), []

    store = recorded(tmp_path, scene)
    assert [s.label for s in gpu_series(store, T0, T0 + H, 3600)] == ["0", "0/0", "0/1", "1"]
