"""The real NVML backend, through the real pynvml, against the fake libnvidia-ml.so.1.

Each scenario runs `gpubox top --once --json` in a subprocess with the fake on LD_LIBRARY_PATH,
and every figure is checked against the scenario that defined it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import MIB, FakeBox, FakeGpu, FakeProcess
from tests.helpers import run_gpubox

EVENT_NAMES = {
    0x1: "gpu_idle",
    0x4: "sw_power_cap",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def top_json(box: FakeBox, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    path = box.write(tmp_path / "scenario.txt")
    res = run_gpubox(
        "top", "--once", "--json", "--interval", "0.05", *extra, env=fake_nvml_env(path, box.library_variant)
    )
    return res.returncode, json.loads(res.stdout) if res.stdout else {}, res.stderr


def events(mask: int) -> list[str]:
    return [name for bit, name in sorted(EVENT_NAMES.items()) if mask & bit]


def assert_gpu_matches(gpu: dict[str, Any], spec: FakeGpu, index: int) -> None:
    assert gpu["index"] == index
    assert gpu["uuid"] == spec.uuid
    assert gpu["name"] == spec.name
    assert gpu["pci_bus_id"] == spec.pci_bus_id
    assert gpu["lost"] is False
    assert gpu["gpu_busy"] == spec.gpu_util
    assert gpu["mem_busy"] == spec.mem_util
    assert gpu["mem_total_bytes"] == spec.memory_total
    assert gpu["mem_used_bytes"] == spec.memory_used
    assert gpu["power_w"] == spec.power_mw / 1000
    assert gpu["power_limit_w"] == (spec.enforced_power_limit_mw or spec.power_limit_mw) / 1000
    assert gpu["energy_mj"] == spec.energy_mj  # the counter, read once per snapshot here
    assert gpu["temperature_c"] == spec.temperature
    assert gpu["clock_sm_mhz"] == spec.sm_clock
    assert gpu["clock_mem_mhz"] == spec.mem_clock
    assert gpu["clock_event_reasons"] == events(spec.clock_event_reasons)
    assert (gpu["pcie_link_gen"], gpu["pcie_link_width"]) == (spec.pcie_gen, spec.pcie_width)
    assert (gpu["pcie_link_gen_max"], gpu["pcie_link_width_max"]) == (spec.pcie_gen_max, spec.pcie_width_max)


def test_hopper8_every_figure(tmp_path: Path) -> None:
    box = scenarios.hopper8(processes=40)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    data = doc["data"]
    assert data["backend"] == "nvml"
    assert data["host"]["driver_version"] == box.driver_version
    assert data["host"]["cuda_driver_version"] == "12.4"
    assert data["host"]["nvml_version"] == box.nvml_version
    assert len(data["gpus"]) == 8
    for i, (gpu, spec) in enumerate(zip(data["gpus"], box.gpus, strict=True)):
        assert_gpu_matches(gpu, spec, i)
        assert gpu["sm_active"] == spec.sm_active
        assert gpu["sm_occupancy"] == spec.sm_occupancy
        assert gpu["pcie_source"] == "gpm"
        assert gpu["pcie_tx_Bps"] == spec.pcie_tx_bps
        assert gpu["pcie_rx_Bps"] == spec.pcie_rx_bps
        assert gpu["reasons"] == {}, gpu["reasons"]
    # GPU 7 trained down to Gen4 x8 of Gen5 x16.
    assert (data["gpus"][7]["pcie_link_gen"], data["gpus"][7]["pcie_link_width"]) == (4, 8)
    procs = {p["pid"]: p for p in data["processes"]}
    assert len(procs) == 40
    for gi, spec in enumerate(box.gpus):
        for fp in spec.processes:
            p = procs[fp.pid]
            assert (p["gpu_index"], p["gpu_uuid"], p["kind"]) == (gi, spec.uuid, "compute")
            assert p["gpu_mem_bytes"] == fp.used_memory
            assert p["sm_util"] == fp.sm_util
            # These pids do not exist on this host: unknown, never zero.
            assert p["cpu_percent"] is None and p["reasons"]["cpu_percent"] == "no_process"
            assert p["loader_wait"] is None and p["reasons"]["loader_wait"] == "no_process"


def test_consumer_gpu_without_gpm_or_pcie_figures(tmp_path: Path) -> None:
    box = scenarios.consumer(processes=2)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    (gpu,) = doc["data"]["gpus"]
    assert_gpu_matches(gpu, box.gpus[0], 0)
    assert gpu["sm_active"] is None and gpu["sm_occupancy"] is None
    assert gpu["pcie_tx_Bps"] is None and gpu["pcie_rx_Bps"] is None and gpu["pcie_source"] is None
    assert gpu["reasons"] == {
        "sm_active": "not_supported",
        "sm_occupancy": "not_supported",
        "pcie_tx_Bps": "not_supported",
        "pcie_rx_Bps": "not_supported",
    }
    kinds = {p["pid"]: (p["kind"], p["gpu_mem_bytes"], p["sm_util"]) for p in doc["data"]["processes"]}
    assert kinds == {fp.pid: (fp.type, fp.used_memory, fp.sm_util) for fp in box.gpus[0].processes}


def test_no_permission_on_process_utilization(tmp_path: Path) -> None:
    box = scenarios.no_permission(processes=6)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    procs = doc["data"]["processes"]
    assert len(procs) == 6
    for p in procs:
        assert p["sm_util"] is None and p["reasons"]["sm_util"] == "no_permission"
        assert p["gpu_mem_bytes"] is not None
    for gpu, spec in zip(doc["data"]["gpus"], box.gpus, strict=True):
        assert gpu["sm_active"] == spec.sm_active  # the rest of the GPU is unaffected


def test_the_clients_of_an_mps_server_are_listed(tmp_path: Path) -> None:
    """Under MPS the compute list holds only the server: the clients doing the work must show."""
    box = scenarios.hopper(gpus=1, processes=0)
    gpu = box.gpus[0]
    gpu.processes = [
        FakeProcess(pid=4000, used_memory=512 * MIB),  # nvidia-cuda-mps-server
        FakeProcess(pid=4001, used_memory=20 << 30, type="mps"),
        FakeProcess(pid=4002, used_memory=30 << 30, type="mps"),
    ]
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    procs = {p["pid"]: p for p in doc["data"]["processes"]}
    assert {pid: p["kind"] for pid, p in procs.items()} == {4000: "compute", 4001: "mps", 4002: "mps"}
    assert procs[4002]["gpu_mem_bytes"] == 30 << 30 and procs[4002]["gpu_uuid"] == gpu.uuid
    assert "processes" not in doc["data"]["gpus"][0]["reasons"]


def test_a_process_in_both_the_graphics_and_the_compute_list_is_both(tmp_path: Path) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].processes = [
        FakeProcess(pid=5000, used_memory=2 << 30, type="both"),
        FakeProcess(pid=5001, used_memory=1 << 30, type="graphics"),
        FakeProcess(pid=5002, used_memory=3 << 30),
    ]
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    procs = {p["pid"]: p for p in doc["data"]["processes"]}
    assert {pid: p["kind"] for pid, p in procs.items()} == {5000: "compute+graphics", 5001: "graphics", 5002: "compute"}
    assert procs[5000]["gpu_mem_bytes"] == 2 << 30  # one process: its memory once


def test_gpu_lost_mid_run(tmp_path: Path) -> None:
    """GPU 1 answers the first refresh of --once and falls off the bus on the second."""
    box = scenarios.lost_gpu(processes=4)
    box.gpus[1].lost_after = 1
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    g0, g1 = doc["data"]["gpus"]
    assert_gpu_matches(g0, box.gpus[0], 0)
    assert g1["lost"] is True and g1["uuid"] == box.gpus[1].uuid
    assert g1["gpu_busy"] is None and g1["reasons"]["gpu_busy"] == "gpu_lost"
    assert g1["reasons"]["temperature_c"] == "gpu_lost"
    assert {p["gpu_index"] for p in doc["data"]["processes"]} == {0}


def test_old_driver_missing_functions(tmp_path: Path) -> None:
    box = scenarios.old_driver(processes=4)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    for i, (gpu, spec) in enumerate(zip(doc["data"]["gpus"], box.gpus, strict=True)):
        # Clock events come from the older ...ThrottleReasons call.
        assert_gpu_matches(gpu, spec, i)
        assert gpu["sm_active"] is None and gpu["reasons"]["sm_active"] == "function_missing"
        assert gpu["reasons"]["sm_occupancy"] == "function_missing"
        # No GPM, no field counters: PCIe falls back to the throughput call.
        assert gpu["pcie_source"] == "throughput"
        assert gpu["pcie_tx_Bps"] == spec.pcie_tx_bps and gpu["pcie_rx_Bps"] == spec.pcie_rx_bps
    assert doc["data"]["host"]["cuda_driver_version"] == "11.7"


def test_struct_version_mismatch(tmp_path: Path) -> None:
    box = scenarios.version_mismatch(processes=4)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    for i, (gpu, spec) in enumerate(zip(doc["data"]["gpus"], box.gpus, strict=True)):
        assert_gpu_matches(gpu, spec, i)
        assert gpu["sm_active"] is None and gpu["reasons"]["sm_active"] == "library_mismatch"
        assert gpu["sm_occupancy"] is None and gpu["reasons"]["sm_occupancy"] == "library_mismatch"
        assert gpu["pcie_source"] == "counters"
        assert gpu["pcie_tx_Bps"] == spec.pcie_tx_bps and gpu["pcie_rx_Bps"] == spec.pcie_rx_bps


def test_mig_instances(tmp_path: Path) -> None:
    box = scenarios.mig(processes_per_instance=2)
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    parent, *instances = doc["data"]["gpus"]
    spec = box.gpus[0]
    assert parent["mig_instance"] is None and parent["power_w"] == spec.power_mw / 1000
    assert [g["mig_instance"] for g in instances] == [m.gpu_instance_id for m in spec.migs]
    assert [g["uuid"] for g in instances] == [m.uuid for m in spec.migs]
    assert [g["name"] for g in instances] == [m.name for m in spec.migs]
    assert [g["mem_total_bytes"] for g in instances] == [m.memory_total for m in spec.migs]
    # GPM per instance, through nvmlGpmMigSampleGet on the parent.
    assert [g["sm_active"] for g in instances] == [m.sm_active for m in spec.migs]
    assert [g["sm_occupancy"] for g in instances] == [m.sm_occupancy for m in spec.migs]
    # The link is the card's, and so is its traffic: an instance row that said 0 B/s would look
    # like a starved job.
    assert all(g["pcie_link_gen_max"] == spec.pcie_gen_max for g in instances)
    assert (parent["pcie_tx_Bps"], parent["pcie_rx_Bps"]) == (spec.pcie_tx_bps, spec.pcie_rx_bps)
    for g in instances:
        assert g["pcie_tx_Bps"] is None and g["pcie_rx_Bps"] is None and g["pcie_source"] is None
        assert g["reasons"]["pcie_tx_Bps"] == g["reasons"]["pcie_rx_Bps"] == "not_supported"
    # So is the energy counter: counted once, on the card, never again per instance.
    assert parent["energy_mj"] == spec.energy_mj
    assert all(g["energy_mj"] is None and g["reasons"]["energy_mj"] == "not_supported" for g in instances)
    by_uuid = {m.gpu_instance_id: m.uuid for m in spec.migs}
    procs = doc["data"]["processes"]
    assert len(procs) == len(spec.processes)
    for fp in spec.processes:
        (p,) = [p for p in procs if p["pid"] == fp.pid]
        assert p["gpu_uuid"] == by_uuid[fp.gpu_instance_id]
        assert p["gpu_mem_bytes"] == fp.used_memory
        assert p["sm_util"] is None and p["reasons"]["sm_util"] == "not_supported"


def test_pcie_counters_when_gpm_has_no_pcie_metrics(tmp_path: Path) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].gpm = False
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    gpu = doc["data"]["gpus"][0]
    assert gpu["pcie_source"] == "counters"
    assert gpu["pcie_rx_Bps"] == box.gpus[0].pcie_rx_bps
    assert gpu["reasons"]["sm_active"] == "not_supported"


@pytest.mark.parametrize("init_error", ["driver_not_loaded", "no_permission"])
def test_driver_problems_are_exit_3_with_one_line(tmp_path: Path, init_error: str) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    box.init_error = init_error
    path = box.write(tmp_path / "s.txt")
    res = run_gpubox("top", "--once", env=fake_nvml_env(path))
    assert res.returncode == 3
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_processes_with_real_pids_get_user_command_and_cpu(tmp_path: Path) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "train-marker"])
    try:
        box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=1), [child.pid])
        code, doc, err = top_json(box, tmp_path)
        assert code == 0, err
        (p,) = doc["data"]["processes"]
        assert p["pid"] == child.pid and "train-marker" in p["command"]
        assert p["user"] and p["rss_bytes"] > 0 and p["start_time"] > 0
        assert p["cpu_percent"] is not None  # a rate over the --once window
        assert p["gpu_mem_bytes"] == 512 * MIB
    finally:
        child.kill()
        child.wait()


def test_processes_started_by_the_queue_show_their_job(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_JOB_")}
    job = subprocess.Popen(argv, env={**plain_env, "GPUBOX_JOB_ID": "7", "GPUBOX_JOB_KIND": "train"})
    plain = subprocess.Popen(argv, env=plain_env)
    try:
        box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=2), [job.pid, plain.pid])
        code, doc, err = top_json(box, tmp_path)
        assert code == 0, err
        procs = {p["pid"]: p for p in doc["data"]["processes"]}
        assert (procs[job.pid]["job_id"], procs[job.pid]["job_kind"]) == (7, "train")
        assert (procs[plain.pid]["job_id"], procs[plain.pid]["job_kind"]) == (None, None)
        assert "job_id" not in procs[job.pid]["reasons"] and "job_id" not in procs[plain.pid]["reasons"]

        path = box.write(tmp_path / "scenario.txt")
        env = {**fake_nvml_env(path, box.library_variant), "COLUMNS": "200"}
        res = run_gpubox("top", "--once", "--no-color", "--interval", "0.05", env=env)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        (header,) = [line for line in lines if line.lstrip().startswith("PID ")]
        at = header.index("Job")  # the column is left-justified under its header
        rows = {line.split()[0]: line for line in lines if line.strip()}
        assert rows[str(job.pid)][at:].split()[:2] == ["7", "train"]
        assert rows[str(plain.pid)][at:].split()[0] == "–"
    finally:
        for child in (job, plain):
            child.kill()
            child.wait()


def test_gpu_option_with_a_mig_uuid_shows_that_instance_alone(tmp_path: Path) -> None:
    box = scenarios.mig(processes_per_instance=2)
    first, second = box.gpus[0].migs
    code, doc, err = top_json(box, tmp_path, "--gpu", first.uuid)
    assert code == 0, err
    assert [g["uuid"] for g in doc["data"]["gpus"]] == [first.uuid]
    mine = {p.pid for p in box.gpus[0].processes if p.gpu_instance_id == first.gpu_instance_id}
    assert {p["pid"] for p in doc["data"]["processes"]} == mine
    # The GPU's index, or its own UUID, still names the card with every instance on it.
    for whole in ("0", box.gpus[0].uuid[:12]):
        code, doc, err = top_json(box, tmp_path, "--gpu", whole)
        assert code == 0, err
        assert [g["uuid"] for g in doc["data"]["gpus"]] == [box.gpus[0].uuid, first.uuid, second.uuid]
        assert len(doc["data"]["processes"]) == len(box.gpus[0].processes)


@pytest.mark.parametrize("shape", ["v2", "version_mismatch"])
def test_memory_used_leaves_out_the_drivers_reserve_as_nvidia_smi(tmp_path: Path, shape: str) -> None:
    # nvidia-smi, nvtop and DCGM show used memory without the driver's reserve (NVML's v2 call):
    # a top that showed it on top would disagree with them by hundreds of MiB on every GPU. A
    # driver that cannot answer v2 gives the older figure, with the reserve, and no error.
    box = scenarios.hopper(2, processes=2) if shape == "v2" else scenarios.version_mismatch(processes=2)
    for gpu in box.gpus:
        gpu.memory_used, gpu.memory_reserved = 20_000 * MIB, 512 * MIB
    code, doc, err = top_json(box, tmp_path)
    assert code == 0, err
    want = 20_000 * MIB - 512 * MIB if shape == "v2" else 20_000 * MIB
    for gpu in doc["data"]["gpus"]:
        assert gpu["mem_used_bytes"] == want
        assert gpu["mem_total_bytes"] == scenarios.H100_MEMORY
        assert "mem_used_bytes" not in gpu["reasons"]
    assert doc["data"]["errors"] == []
