"""The arithmetic of one interval: busy, idle, starved, energy, PCIe, unqueued, gaps, splitting."""

from __future__ import annotations

import pytest

from gpubox.ledger.accounting import Gap, GpuMark, IntervalUsage, account_interval, split_periods
from gpubox.ledger.rollup import Rollup
from gpubox.ledger.usage import GPU_BUSY, SM_ACTIVE, GpuUsage, UnqueuedUsage
from tests.ledger.builders import T0, gpu, job, proc


def interval(result: IntervalUsage | Gap | None) -> IntervalUsage:
    assert isinstance(result, IntervalUsage), result
    return result


def test_busy_idle_and_starved_seconds_of_an_allocated_gpu() -> None:
    g = gpu(gpu_busy=40.0, sm_occupancy=25.0, pcie_tx_Bps=1000.0, pcie_rx_Bps=3000.0)
    p = proc(10, job_id=7, loader_wait=0.5, mem=2_000)
    found = interval(account_interval(GpuMark(T0), g, T0 + 10, [p], [job(7, "GPU-0")], max_gap_s=15))
    u = found.gpu
    assert (u.observed_s, u.allocated_s, u.busy_s, u.busy_known_s) == (10, 10, 4, 10)
    assert u.idle_allocated_s == 6
    assert (u.starved_s, u.loader_known_s) == (5, 10)
    assert (u.occupancy_s, u.occupancy_known_s) == (2.5, 10)
    assert (u.pcie_tx_bytes, u.pcie_rx_bytes, u.pcie_known_s) == (10_000, 30_000, 10)
    assert u.busy_source == GPU_BUSY and u.unqueued_s == 0
    [part] = found.attempts
    assert part.allocation.key == (7, 1)
    assert (part.usage.allocated_s, part.usage.busy_s, part.usage.idle_allocated_s, part.usage.starved_s) == (
        10,
        4,
        6,
        5,
    )
    assert part.gpu_mem_bytes == 2_000


def test_sm_active_is_preferred_to_gpu_busy() -> None:
    g = gpu(gpu_busy=100.0, sm_active=30.0)
    u = interval(account_interval(GpuMark(T0), g, T0 + 10, [], [], max_gap_s=15)).gpu
    assert u.busy_s == pytest.approx(3.0) and u.busy_source == SM_ACTIVE


def test_unknown_figures_add_nothing_and_are_not_known() -> None:
    u = interval(account_interval(GpuMark(T0), gpu(), T0 + 5, [], [job(1, "GPU-0")], max_gap_s=15)).gpu
    assert u.observed_s == 5 and u.allocated_s == 5
    assert u.busy_known_s == u.idle_allocated_s == u.loader_known_s == u.energy_known_s == u.pcie_known_s == 0
    assert u.busy_source == 0


def test_starved_takes_the_largest_loader_wait_of_the_jobs_processes() -> None:
    procs = [proc(1, job_id=3, loader_wait=0.2), proc(2, job_id=3, loader_wait=0.6), proc(3, job_id=3)]
    found = interval(account_interval(GpuMark(T0), gpu(gpu_busy=50.0), T0 + 10, procs, [job(3, "GPU-0")], 15))
    assert found.gpu.starved_s == pytest.approx(6.0)


def test_a_process_without_readable_job_id_belongs_to_the_job_of_its_user() -> None:
    unreadable = {"job_id": "no_permission"}
    procs = [
        proc(1, user="alice", loader_wait=0.5, mem=100, reasons=unreadable),
        proc(2, user="eve", loader_wait=1.0, mem=900, reasons=unreadable),
    ]
    found = interval(account_interval(GpuMark(T0), gpu(gpu_busy=0.0), T0 + 10, procs, [job(3, "GPU-0")], 15))
    [part] = found.attempts
    assert part.usage.starved_s == 5 and part.gpu_mem_bytes == 100  # eve's process is not the job's
    assert found.unqueued == () and found.gpu.unqueued_s == 0  # nor known to be outside the queue


def test_an_untagged_process_of_the_queue_owner_is_not_the_job_on_its_gpu() -> None:
    # Every job runs as the queue's owner: their notebook on a held GPU is not the job's, but use outside the queue.
    procs = [
        proc(1, user="alice", job_id=1, loader_wait=0.0, mem=1 << 30),
        proc(2, user="alice", loader_wait=0.9, mem=40 << 30),  # its tag was read: no job started it
    ]
    found = interval(account_interval(GpuMark(T0), gpu(gpu_busy=50.0), T0 + 10, procs, [job(1, "GPU-0")], 15))
    [part] = found.attempts
    assert (part.usage.allocated_s, part.usage.busy_s) == (10, 5)
    assert (part.usage.starved_s, part.usage.loader_known_s, part.gpu_mem_bytes) == (0, 10, 1 << 30)
    assert (found.gpu.allocated_s, found.gpu.starved_s, found.gpu.unqueued_s) == (10, 0, 10)
    assert found.unqueued == (("alice", UnqueuedUsage(gpu_s=10, busy_s=5, busy_known_s=10)),)


def test_energy_from_the_counter_estimated_from_power_or_a_gap_after_a_reset() -> None:
    measured = interval(
        account_interval(GpuMark(T0, 1_000_000), gpu(energy_mj=4_000_000, power_w=999.0), T0 + 10, [], [], 15)
    )
    assert (measured.gpu.energy_j, measured.gpu.energy_estimated_j, measured.gpu.energy_known_s) == (3000, 0, 10)
    estimated = interval(account_interval(GpuMark(T0), gpu(power_w=250.0), T0 + 4, [], [], 15))
    assert (estimated.gpu.energy_j, estimated.gpu.energy_estimated_j, estimated.gpu.energy_known_s) == (1000, 1000, 4)
    reset = interval(account_interval(GpuMark(T0, 9_000_000), gpu(energy_mj=2_000, power_w=300.0), T0 + 5, [], [], 15))
    assert (reset.gpu.energy_j, reset.gpu.energy_known_s) == (0, 0)  # a gap for energy, never negative


@pytest.mark.parametrize(
    ("mark_mj", "figures"),
    [
        (1_000_000, {"energy_mj": (1 << 64) - 1}),  # all ones: NVML's "not available"
        (1_000_000, {"energy_mj": 1_000_000 + 10 * 5_001_000}),  # more than 5 kW for 10 s
        (None, {"power_w": 0xFFFFFFFF / 1000}),
    ],
)
def test_a_misread_energy_counter_or_power_is_no_figure(mark_mj: int | None, figures: dict[str, object]) -> None:
    found = interval(account_interval(GpuMark(T0, mark_mj), gpu(**figures), T0 + 10, [], [], 15))
    assert (found.gpu.energy_j, found.gpu.energy_estimated_j, found.gpu.energy_known_s) == (0, 0, 0)
    most = interval(
        account_interval(GpuMark(T0, 1_000_000), gpu(energy_mj=1_000_000 + 10 * 4_999_000), T0 + 10, [], [], 15)
    )
    assert most.gpu.energy_j == pytest.approx(49_990)  # a big board's draw is still a figure


def test_an_interval_longer_than_the_max_gap_is_a_gap() -> None:
    found = account_interval(GpuMark(T0), gpu(gpu_busy=100.0), T0 + 16, [], [job(1, "GPU-0")], max_gap_s=15)
    assert found == Gap("GPU-0", T0, T0 + 16)
    assert account_interval(GpuMark(T0), gpu(), T0, [], [], 15) is None  # not newer: already recorded


def test_an_unallocated_gpu_is_unqueued_time_split_among_its_users() -> None:
    procs = [proc(1, user="bob"), proc(2, user="bob"), proc(3, user="carol", job_id=9)]
    found = interval(account_interval(GpuMark(T0), gpu(gpu_busy=60.0), T0 + 10, procs, [], 15))
    assert found.gpu.unqueued_s == 10 and found.gpu.allocated_s == 0
    by_user = dict(found.unqueued)
    assert set(by_user) == {"bob", "carol"}
    assert (by_user["bob"].gpu_s, by_user["bob"].busy_s) == (5, 3)
    idle = interval(account_interval(GpuMark(T0), gpu(gpu_busy=60.0), T0 + 10, [], [], 15))
    assert idle.gpu.unqueued_s == 0 and idle.unqueued == ()


def test_a_shared_gpu_is_split_evenly_between_its_holders() -> None:
    holders = [job(1, "GPU-0"), job(2, "GPU-0", user="bob")]
    procs = [proc(1, job_id=1, loader_wait=1.0), proc(2, job_id=2, loader_wait=0.0)]
    found = interval(
        account_interval(GpuMark(T0, 0), gpu(gpu_busy=50.0, energy_mj=10_000_000), T0 + 10, procs, holders, 15)
    )
    parts = {p.allocation.job_id: p.usage for p in found.attempts}
    assert parts[1].allocated_s == parts[2].allocated_s == 5
    assert parts[1].energy_j == parts[2].energy_j == 5000
    assert (parts[1].starved_s, parts[2].starved_s) == (5, 0)
    assert found.gpu.allocated_s == 10 and found.gpu.starved_s == 5


def test_a_lost_gpu_is_observed_but_nothing_about_it_is_known() -> None:
    u = interval(account_interval(GpuMark(T0), gpu(lost=True, power_w=100.0), T0 + 5, [], [], 15)).gpu
    assert u.observed_s == 5 and u.busy_known_s == 0 and u.energy_known_s == 0


@pytest.mark.parametrize("odd", [float("nan"), float("inf")])
def test_a_figure_that_is_not_a_number_is_unknown_not_zero_or_full(odd: float) -> None:
    """GPM's figures are doubles and can be NaN: no reading, so busy falls back to gpu_busy and the rest is unknown."""
    g = gpu(gpu_busy=40.0, sm_active=odd, sm_occupancy=odd, pcie_tx_Bps=odd, pcie_rx_Bps=1000.0, power_w=odd)
    p = proc(10, job_id=7, loader_wait=odd)
    found = interval(account_interval(GpuMark(T0), g, T0 + 10, [p], [job(7, "GPU-0")], max_gap_s=15))
    u = found.gpu
    assert (u.busy_s, u.busy_known_s, u.busy_source) == (4, 10, GPU_BUSY)
    assert u.occupancy_known_s == u.pcie_known_s == u.energy_known_s == u.loader_known_s == 0
    assert u.occupancy_s == u.pcie_tx_bytes == u.pcie_rx_bytes == u.energy_j == u.starved_s == 0
    [part] = found.attempts
    assert (part.usage.busy_s, part.usage.loader_known_s, part.usage.energy_known_s) == (4, 0, 0)


def test_split_periods_cuts_at_minute_and_hour_boundaries() -> None:
    assert split_periods(T0 + 55, T0 + 65, 60) == [(T0, 5), (T0 + 60, 5)]
    assert split_periods(T0 + 60, T0 + 65, 60) == [(T0 + 60, 5)]
    assert split_periods(T0 - 2, T0 + 3, 3600) == [(T0 - 3600, 2), (T0, 3)]


def test_the_rollup_splits_an_interval_across_minutes_in_proportion() -> None:
    g = gpu(gpu_busy=50.0, energy_mj=10_000)
    found = interval(account_interval(GpuMark(T0 + 56, 0), g, T0 + 66, [], [job(4, "GPU-0")], 15))
    rollup = Rollup()
    rollup.add(found)
    batch = rollup.batch({})
    first, second = batch.gpu_minutes[("GPU-0", T0)], batch.gpu_minutes[("GPU-0", T0 + 60)]
    assert (first.observed_s, first.busy_s, first.energy_j) == (4, 2, 4)
    assert (second.observed_s, second.busy_s, second.energy_j) == (6, 3, 6)
    assert first.plus(second) == GpuUsage(
        observed_s=10,
        allocated_s=10,
        busy_s=5,
        busy_known_s=10,
        idle_allocated_s=5,
        energy_j=10,
        energy_known_s=10,
        busy_source=GPU_BUSY,
    )
    assert batch.attempt_hours[(4, 1, T0)].allocated_s == 10
