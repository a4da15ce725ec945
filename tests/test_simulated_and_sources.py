import signal

import pytest

from gpubox.telemetry.simulated import SimulatedBackend
from gpubox.telemetry.sources import parse_gpu_selection, snapshot_over


def test_simulated_box_is_deterministic_by_refresh_count() -> None:
    a = SimulatedBackend(gpus=3, processes=5, seed=1, clock=lambda: 100.0)
    b = SimulatedBackend(gpus=3, processes=5, seed=1, clock=lambda: 100.0)
    assert [a.sample() for _ in range(3)] == [b.sample() for _ in range(3)]


def test_first_sample_has_no_rates_and_says_why() -> None:
    box = SimulatedBackend(gpus=2, processes=0, clock=lambda: 0.0)
    first = box.sample().gpus[0]
    assert first.pcie_rx_Bps is None and first.reasons["pcie_rx_Bps"] == "warming_up"
    second = box.sample().gpus[0]
    assert second.pcie_rx_Bps is not None and "pcie_rx_Bps" not in second.reasons


def test_snapshot_over_takes_two_samples_and_waits_the_window() -> None:
    box = SimulatedBackend(gpus=1, processes=1, clock=lambda: 0.0)
    waited: list[float] = []
    snap = snapshot_over(box, 0.7, sleep=waited.append)
    assert waited == [0.7]
    assert snap.gpus[0].pcie_rx_Bps is not None


def test_send_signal_on_simulated_box_drops_the_process_and_never_signals_real_pids() -> None:
    box = SimulatedBackend(gpus=1, processes=2, clock=lambda: 0.0)
    pid = box.sample().processes[0].pid
    box.send_signal(pid, signal.SIGTERM, None)
    assert box.signals == [(pid, signal.SIGTERM)]
    assert pid not in {p.pid for p in box.sample().processes}
    with pytest.raises(ProcessLookupError):
        box.send_signal(pid, signal.SIGTERM, None)


def test_gpu_selection() -> None:
    snap = SimulatedBackend(gpus=4, processes=0, clock=lambda: 0.0).sample()
    assert parse_gpu_selection("0, 2", snap.gpus) == {snap.gpus[0].uuid, snap.gpus[2].uuid}
    assert parse_gpu_selection(snap.gpus[3].uuid[:12], snap.gpus) == {snap.gpus[3].uuid}
    for bad in ("7", "GPU-x", "GPU-5e1a", ","):
        with pytest.raises(ValueError):
            parse_gpu_selection(bad, snap.gpus)
