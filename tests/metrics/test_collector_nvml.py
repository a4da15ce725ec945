"""The collector on the real NVML backend, over the fake libnvidia-ml: in this process through the
`nvml` fixture, and `metrics dump` in a subprocess with the fake on LD_LIBRARY_PATH."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpubox.metrics.exposition import BoxCollector, exposition_text
from gpubox.telemetry.loader_wait import LoaderWaitReader
from gpubox.telemetry.nvml_backend import NvmlBackend
from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import FakeBox, FakeGpu
from tests.metrics.figures import assert_gpus_match, assert_processes_match
from tests.metrics.support import (
    RecordingBackend,
    free_port,
    key,
    metrics_argv,
    of,
    run_metrics,
    samples,
    wait_for_port,
)


def scrapes(module: Any, count: int = 2) -> tuple[dict, RecordingBackend]:
    backend = RecordingBackend(NvmlBackend(module, clock=lambda: 1000.0, loader_wait=LoaderWaitReader(sampling=False)))
    collector = BoxCollector(backend)
    try:
        for _ in range(count):
            found = samples(exposition_text(collector))
    finally:
        collector.close()
    return found, backend


def gpu_key(name: str, spec: FakeGpu, index: str) -> tuple:
    return key(name, {"gpu": index, "uuid": spec.uuid, "name": spec.name})


def assert_matches_scenario(found: dict, spec: FakeGpu, index: str, gpm: bool = True) -> None:
    def value(name: str) -> float:
        return found[gpu_key(name, spec, index)]

    assert value("gpubox_gpu_busy_ratio") == pytest.approx(spec.gpu_util / 100)
    assert value("gpubox_gpu_memory_used_bytes") == spec.memory_used
    assert value("gpubox_gpu_memory_total_bytes") == spec.memory_total
    assert value("gpubox_gpu_power_watts") == spec.power_mw / 1000
    assert value("gpubox_gpu_temperature_celsius") == spec.temperature
    assert value("gpubox_gpu_pcie_link_generation") == spec.pcie_gen
    assert value("gpubox_gpu_pcie_link_width_lanes") == spec.pcie_width
    assert value("gpubox_gpu_pcie_link_max_generation") == spec.pcie_gen_max
    assert value("gpubox_gpu_lost") == 0
    if gpm:
        assert value("gpubox_gpu_sm_active_ratio") == pytest.approx(spec.sm_active / 100)
        assert value("gpubox_gpu_sm_occupancy_ratio") == pytest.approx(spec.sm_occupancy / 100)
        assert value("gpubox_gpu_pcie_tx_bytes_per_second") == spec.pcie_tx_bps
        assert value("gpubox_gpu_pcie_rx_bytes_per_second") == spec.pcie_rx_bps
    energy = found.get(gpu_key("gpubox_gpu_energy_joules_total", spec, index))
    assert energy is None or energy == spec.energy_mj / 1000


def assert_processes_of_scenario(found: dict, box: FakeBox, index_of: dict[str, str]) -> None:
    memory = of(found, "gpubox_process_gpu_memory_bytes")
    util = of(found, "gpubox_process_sm_util_ratio")
    for gpu in box.gpus:
        for p in gpu.processes:
            (labels,) = [labels for labels in memory if dict(labels)["pid"] == str(p.pid)]
            assert dict(labels)["gpu"] == index_of[gpu.uuid] and dict(labels)["uuid"] == gpu.uuid
            assert dict(labels)["job"] == "" and dict(labels)["kind"] == ""  # not started by the queue
            assert memory[labels] == p.used_memory
            assert util[labels] == pytest.approx(p.sm_util / 100)


def test_hopper_every_figure_of_the_scenario(nvml: Any) -> None:
    box = scenarios.hopper(gpus=2, processes=6)
    found, backend = scrapes(nvml(box))
    for i, spec in enumerate(box.gpus):
        assert_matches_scenario(found, spec, str(i))
    assert_processes_of_scenario(found, box, {g.uuid: str(i) for i, g in enumerate(box.gpus)})
    snap = backend.snapshots[-1]
    assert_gpus_match(found, snap.gpus)
    assert_processes_match(found, snap.processes, {g.uuid: g.label for g in snap.gpus})


def test_first_scrape_on_nvml_is_warming_up(nvml: Any) -> None:
    found, _ = scrapes(nvml(scenarios.hopper(gpus=1, processes=0)), count=1)
    assert "gpubox_gpu_busy_ratio" in {n for n, _ in found}
    assert not {n for n, _ in found} & {"gpubox_gpu_sm_active_ratio", "gpubox_gpu_pcie_rx_bytes_per_second"}


def test_consumer_gpu_without_gpm_has_no_sm_or_pcie_rate_samples(nvml: Any) -> None:
    box = scenarios.consumer(processes=3)
    found, backend = scrapes(nvml(box))
    spec = box.gpus[0]
    assert_matches_scenario(found, spec, "0", gpm=False)
    present = {n for n, _ in found}
    for name in (
        "gpubox_gpu_sm_active_ratio",
        "gpubox_gpu_sm_occupancy_ratio",
        "gpubox_gpu_pcie_tx_bytes_per_second",
        "gpubox_gpu_pcie_rx_bytes_per_second",
    ):
        assert name not in present, f"{name} was exported for a GPU that does not give it"
    assert_processes_of_scenario(found, box, {spec.uuid: "0"})
    assert_gpus_match(found, backend.snapshots[-1].gpus)


def test_mig_instances_with_their_own_gpm_figures_and_processes(nvml: Any) -> None:
    box = scenarios.mig(processes_per_instance=2)
    found, backend = scrapes(nvml(box))
    gpu = box.gpus[0]
    for mig in gpu.migs:
        labels = {"gpu": f"0/{mig.gpu_instance_id}", "uuid": mig.uuid, "name": mig.name}
        assert found[key("gpubox_gpu_sm_active_ratio", labels)] == pytest.approx(mig.sm_active / 100)
        assert found[key("gpubox_gpu_memory_used_bytes", labels)] == mig.memory_used
    memory = of(found, "gpubox_process_gpu_memory_bytes")
    instance_of = {m.gpu_instance_id: f"0/{m.gpu_instance_id}" for m in gpu.migs}
    for p in gpu.processes:
        (labels,) = [labels for labels in memory if dict(labels)["pid"] == str(p.pid)]
        assert dict(labels)["gpu"] == instance_of[p.gpu_instance_id]
    snap = backend.snapshots[-1]
    assert_gpus_match(found, snap.gpus)
    assert_processes_match(found, snap.processes, {g.uuid: g.label for g in snap.gpus})


def test_dump_in_a_subprocess_on_the_fake_library(tmp_path: Path) -> None:
    box = scenarios.hopper8(processes=16)
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"), box.library_variant)
    res = run_metrics("dump", "--interval", "0.05", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    found = samples(res.stdout)
    for i, spec in enumerate(box.gpus):
        assert_matches_scenario(found, spec, str(i))
    assert_processes_of_scenario(found, box, {g.uuid: str(i) for i, g in enumerate(box.gpus)})
    assert len(of(found, "gpubox_process_gpu_memory_bytes")) == 16


def test_serve_says_once_that_the_ledger_cannot_be_read(tmp_path: Path) -> None:
    box = scenarios.hopper8(processes=0)
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"), box.library_variant)
    state = tmp_path / "state"
    state.mkdir()
    (state / "ledger.db").write_bytes(b"not a database" * 100)
    env["GPUBOX_STATE_DIR"] = str(state)
    port = free_port()
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        metrics_argv("serve", "--listen", f"127.0.0.1:{port}"), stdout=pipe, stderr=pipe, text=True, env=env
    )
    try:
        wait_for_port("127.0.0.1", port, proc)
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
                found = samples(response.read().decode())
            assert of(found, "gpubox_gpu_busy_ratio") and not of(found, "gpubox_gpu_allocated_seconds_total")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert lines[0] == f"gpubox: serving http://127.0.0.1:{port}/metrics"
    assert len(lines) == 2 and "is corrupt or not a gpubox ledger" in lines[1], lines
    assert lines[1].endswith("its counters are left out")
