"""The whole doctor on a GPU box that exists only in tests: the fake NVML for the GPUs, and a
stand-in for the training environment's python that answers torch_bench.py as a CUDA torch
would, with copies that take known times. It shows the parts working together: the link is
sampled while the copies run, a link that stays at Gen4 x8 under load is found downtrained,
each copy is judged against the link it ran on, and replays that grow during the run count."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import run_gpubox

GB = 1e9
COPY_BYTES = 256 * 1024 * 1024

# Copy rates (GB/s) the stand-in reports for each GPU, by UUID: pinned near what its link carries,
# pageable far below pinned.
BOX = scenarios.downtrained_link()
RATES = {
    BOX.gpus[0].uuid: {"h2d_pinned": 52.0, "d2h_pinned": 50.0, "h2d_pageable": 10.0, "d2h_pageable": 9.0},
    BOX.gpus[1].uuid: {"h2d_pinned": 13.0, "d2h_pinned": 12.5, "h2d_pageable": 6.0, "d2h_pageable": 5.5},
}
for rates in RATES.values():
    rates["d2d"] = 1500.0

STAND_IN = r"""
import json, os, sys, time
if sys.argv[1] == "-c":  # asked for its version, as a Python it answers
    exec(sys.argv[2])
    sys.exit(0)
rates = json.loads(os.environ["STAND_IN_RATES"])
command = sys.argv[2]
if command == "facts":
    print(json.dumps({
        "schema": 1, "kind": "facts", "python": sys.executable, "python_version": "3.11.7",
        "torch_version": "2.5.1+cu124", "torch_missing": False, "torch_error": None, "cuda_build": "12.4",
        "hip_build": None, "cuda_available": True, "cuda_error": None, "cuda_visible_devices": None,
        "device_count": 2, "arch_list": ["sm_80", "sm_86", "sm_90"],
        "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0],
                     "memory_total_bytes": 85520809984, "multiprocessors": 132, "uuid": None,
                     "pci_bus_id": None} for i in range(2)],
        "error": None}))
    sys.exit(0)
uuid = os.environ["CUDA_VISIBLE_DEVICES"]  # the doctor shows the benchmark only the GPU it measures
assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
nbytes, reps = int(sys.argv[sys.argv.index("--bytes") + 1]), int(sys.argv[sys.argv.index("--reps") + 1])
time.sleep(0.3)  # torch starts and the warm-up copies wake the link
started = time.monotonic()
time.sleep(0.8)  # the timed copies: the doctor samples the link meanwhile
ended = time.monotonic()
def copy(kind):
    timer = "wall" if "pageable" in kind else "cuda_event"
    return {"bytes": nbytes, "seconds": [nbytes / (rates[uuid][kind] * 1e9)] * reps, "timer": timer,
            "started_at": started, "ended_at": ended, "error": None}
print(json.dumps({
    "schema": 1, "kind": "transfer", "python": sys.executable, "torch_version": "2.5.1+cu124",
    "torch_missing": False, "torch_error": None, "cuda_build": "12.4", "error": None,
    "device": {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},
    "affinity": {"requested": None, "cpus": None, "applied": False, "error": None},
    "reps": reps, "warmup": 2, "bytes": nbytes,
    "copies": {k: copy(k) for k in ("h2d_pageable", "d2h_pageable", "h2d_pinned", "d2h_pinned", "d2d")},
    "matmul": None}))
"""


def stand_in_python(tmp_path: Path) -> Path:
    path = tmp_path / "python-with-cuda-torch"
    path.write_text(f"#!{sys.executable}\n{STAND_IN}")
    path.chmod(0o755)
    return path


def run_doctor(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    env = fake_nvml_env(BOX.write(tmp_path / "scenario.txt"))
    env["STAND_IN_RATES"] = json.dumps(RATES)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    python = stand_in_python(tmp_path)
    res = run_gpubox("doctor", "--json", "--python", str(python), *args, env=env, timeout=120)
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def checks_of(doc: dict[str, Any]) -> dict[tuple[str, int | None], dict[str, Any]]:
    return {(c["id"], c["gpu"]): c for c in doc["data"]["checks"]}


def test_a_link_that_stays_low_under_load_is_found_and_copies_are_judged_against_it(tmp_path: Path) -> None:
    code, doc = run_doctor(tmp_path, "--full", "--only", "transfer,pcie,gpu,driver")
    assert code == 5, doc["errors"]
    checks = checks_of(doc)
    # GPU 0 idles at Gen1 and runs at Gen5 x16 under load: healthy. GPU 1 stays at Gen4 x8.
    assert checks[("pcie.link", 0)]["status"] == "ok"
    link = checks[("pcie.link", 1)]
    assert link["status"] == "fail" and "Gen4 x8" in link["detail"] and "Gen5 x16" in link["detail"]
    assert link["impact"] == 0.75  # 15.75 of 63 GB/s: three quarters of the bandwidth lost
    assert checks[("pcie.replays", 1)]["status"] == "fail"  # 40 more at every look during the copies
    assert checks[("pcie.replays", 0)]["status"] == "ok"
    # Each GPU's pinned copies against the link it ran on: 52 of 63 GB/s; 13 of 15.75 GB/s.
    transfer = {r["gpu"]: r for r in doc["data"]["benchmarks"]["transfer"]}
    fast, slow = transfer[0]["h2d_pinned"], transfer[1]["h2d_pinned"]
    assert round(fast["gb_per_s"], 6) == 52.0 and round(slow["gb_per_s"], 6) == 13.0
    assert transfer[0]["link_now"] == {"gen": 5, "width": 16} and transfer[1]["link_now"] == {"gen": 4, "width": 8}
    assert abs(fast["link_fraction"] - 52.0 / 63.016) < 0.01
    assert abs(slow["link_fraction"] - 13.0 / 15.754) < 0.01
    assert abs(slow["link_max_fraction"] - 13.0 / 63.016) < 0.01  # what the GPU could do in a good slot
    # Each copy is judged against the link it ran on; the downtrained link is one finding, not three.
    assert checks[("transfer.h2d_pinned", 1)]["status"] == "ok"
    assert "see pcie.link" in checks[("transfer.h2d_pinned", 1)]["detail"]
    # Pageable at a fifth of pinned: a figure, with the advice to pin.
    pageable = checks[("transfer.pageable", 0)]
    assert pageable["value"] == 19.2 and "pin_memory=True" in pageable["meaning"]
    # The downtrained link outranks everything else found on the GPUs.
    gpu_findings = [f for f in doc["data"]["findings"] if f["category"] in {"pcie", "transfer", "gpu"}]
    assert (gpu_findings[0]["id"], gpu_findings[0]["gpu"]) == ("pcie.link", 1)
    # The stand-in is a CUDA build for sm_90 against a CUDA 12.4 driver: nothing wrong there.
    assert checks[("driver.torch_build", None)]["status"] == "ok"
    assert checks[("driver.arch", 0)]["status"] == "ok"
    assert doc["data"]["facts"]["samples"] > 4


def test_quick_benchmarks_the_first_gpu_only_and_gpu_picks_others(tmp_path: Path) -> None:
    code, doc = run_doctor(tmp_path, "--only", "transfer")
    assert code == 0, doc["errors"]
    assert [r["gpu"] for r in doc["data"]["benchmarks"]["transfer"]] == [0]
    code, doc = run_doctor(tmp_path, "--only", "transfer", "--gpu", "1")
    assert [r["gpu"] for r in doc["data"]["benchmarks"]["transfer"]] == [1]


def test_a_gpu_named_twice_is_benchmarked_once(tmp_path: Path) -> None:
    # `--gpu 0,1,0`: each GPU once, in the order first named; a check stays unique per GPU.
    code, doc = run_doctor(tmp_path, "--only", "transfer", "--gpu", "0,1,0")
    assert code == 0, doc["errors"]
    assert [r["gpu"] for r in doc["data"]["benchmarks"]["transfer"]] == [0, 1]
    keys = [(c["id"], c["gpu"]) for c in doc["data"]["checks"]]
    assert len(keys) == len(set(keys))
