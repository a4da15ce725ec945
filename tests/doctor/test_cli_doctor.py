"""`gpubox doctor` through the real CLI, on the fake NVML, as an operator or a cron job runs it:
the JSON envelope, the exit codes (0, 5, 3, 2), the human report and one line for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import FakeBox
from tests.helpers import run_gpubox

# programs that are no Python: one fails, one succeeds and prints nothing
FALSE = shutil.which("false") or "/bin/false"
TRUE = shutil.which("true") or "/bin/true"


def doctor(box: FakeBox | None, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str, str]:
    if box is None:  # a box without the NVIDIA driver: NVML cannot be loaded at all
        empty = tmp_path / "no-driver"
        empty.mkdir(exist_ok=True)
        env = {"LD_LIBRARY_PATH": str(empty)}
    else:
        env = fake_nvml_env(box.write(tmp_path / "scenario.txt"), box.library_variant)
    res = run_gpubox("doctor", *args, env=env, timeout=180)
    doc = json.loads(res.stdout) if "--json" in args and res.stdout.strip() else {}
    return res.returncode, doc, res.stdout, res.stderr


def by_id(doc: dict[str, Any]) -> dict[tuple[str, int | None], dict[str, Any]]:
    return {(c["id"], c["gpu"]): c for c in doc["data"]["checks"]}


def test_a_healthy_box_passes_its_gpu_checks(tmp_path: Path) -> None:
    code, doc, _, err = doctor(scenarios.healthy(2), tmp_path, "--json", "--only", "gpu,pcie")
    assert code == 0, err
    assert (doc["command"], doc["ok"], doc["exit_code"], doc["errors"]) == ("doctor", True, 0, [])
    checks = by_id(doc)
    for gpu in (0, 1):
        assert checks[("gpu.persistence_mode", gpu)]["status"] == "ok"
        assert checks[("gpu.ecc", gpu)]["status"] == "ok"
        assert checks[("gpu.temperature", gpu)]["status"] == "ok"
        # No benchmark ran (--only gpu,pcie): the link was only seen idle, which proves nothing.
        link = checks[("pcie.link", gpu)]
        assert link["status"] == "skip" and "idle" in link["detail"]
    assert doc["data"]["findings"] == []
    assert {c["category"] for c in doc["data"]["checks"]} <= {"gpu", "pcie"}


def test_ecc_errors_fail_with_exit_code_5_and_lead_the_findings(tmp_path: Path) -> None:
    code, doc, _, err = doctor(scenarios.ecc_errors(), tmp_path, "--json", "--only", "gpu")
    assert code == 5, err
    assert doc["ok"] is False and doc["exit_code"] == 5
    data = doc["data"]
    first = data["findings"][0]
    assert first["status"] == "fail" and first["gpu"] == 0 and first["id"] in {"gpu.ecc", "gpu.remapped_rows"}
    assert first["fix"]
    statuses = [f["status"] for f in data["findings"]]
    assert statuses == sorted(statuses, key=lambda s: s != "fail"), "failures come before warnings"
    assert data["summary"].startswith(f"{data['counts']['fail']} failed")
    assert by_id(doc)[("gpu.ecc", 0)]["evidence"]  # the raw counts behind the verdict


def test_persistence_off_is_a_finding_with_its_command(tmp_path: Path) -> None:
    code, doc, _, err = doctor(scenarios.persistence_off(), tmp_path, "--json", "--only", "gpu")
    assert code in (0, 5), err
    found = [f for f in doc["data"]["findings"] if f["id"] == "gpu.persistence_mode"]
    assert {f["gpu"] for f in found} == {0, 1}
    assert all("nvidia-smi -pm 1" in f["fix"] or "nvidia-persistenced" in f["fix"] for f in found)


def test_a_cpu_only_torch_on_a_gpu_box_fails_the_driver_group(tmp_path: Path) -> None:
    # The test environment's torch is the CPU build: on a box with GPUs that is the finding.
    code, doc, _, err = doctor(scenarios.healthy(1), tmp_path, "--json", "--only", "driver")
    assert code == 5, err
    build = by_id(doc)[("driver.torch_build", None)]
    assert build["status"] == "fail"
    assert "download.pytorch.org/whl/cu" in build["fix"]
    assert doc["data"]["facts"]["torch"]["cuda_build"] is None
    assert doc["data"]["facts"]["system"]["driver_version"] == "550.54.15"


def test_transfer_benchmarks_skip_with_the_reason_when_torch_has_no_cuda(tmp_path: Path) -> None:
    code, doc, _, err = doctor(scenarios.healthy(1), tmp_path, "--json", "--only", "transfer")
    assert code == 0, err
    transfer = [c for c in doc["data"]["checks"] if c["category"] == "transfer"]
    assert transfer and all(c["status"] == "skip" and c["detail"] for c in transfer)
    [result] = doc["data"]["benchmarks"]["transfer"]
    assert result["gpu"] == 0 and result["error"]
    assert result["h2d_pinned"]["gb_per_s"] is None  # explicit null, never 0


def test_gpu_groups_asked_for_on_a_box_without_gpus_exit_3(tmp_path: Path) -> None:
    code, doc, _, err = doctor(None, tmp_path, "--json", "--only", "gpu,pcie")
    assert code == 3, err
    assert doc["exit_code"] == 3 and doc["ok"] is False
    assert any("no GPU was found" in n for n in doc["data"]["notes"])
    assert any("no GPU was found" in e for e in doc["errors"])
    code, _, out, err = doctor(None, tmp_path, "--only", "gpu", "--no-color")  # the report, and why it is 3
    assert code == 3 and "nothing could be checked" in out
    assert err.startswith("gpubox: GPU checks were asked for, but no GPU was found") and err.count("\n") == 1, err
    code, doc, _, err = doctor(None, tmp_path, "--json", "--only", "transfer", "--gpu", "0")
    assert code == 3, err  # a GPU named on a box without GPUs: no GPU, not a typo
    assert doc["data"]["benchmarks"]["transfer"][0]["error"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_gpu_named_for_host_checks_alone_asks_for_no_gpu(tmp_path: Path, gpus: int) -> None:
    # With no GPU group to run, --gpu picks nothing: the same on a box with GPUs and without.
    box = scenarios.healthy(1) if gpus else None
    code, doc, _, err = doctor(box, tmp_path, "--json", "--only", "host", "--gpu", "5")
    failed = any(c["status"] == "fail" for c in doc["data"]["checks"])
    assert code == (5 if failed else 0), err
    assert not any("GPU checks were asked for" in n for n in doc["data"]["notes"]) and doc["errors"] == []
    assert {c["category"] for c in doc["data"]["checks"]} == {"host"}


def test_without_gpus_the_whole_run_still_reports_the_host(tmp_path: Path) -> None:
    code, doc, _, err = doctor(None, tmp_path, "--json")
    data = doc["data"]
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    assert code == (5 if failed else 0), err
    categories = {c["category"] for c in data["checks"]}
    assert {"driver", "host", "transfer"} <= categories
    assert by_id(doc)[("driver.nvml", None)]["status"] == "skip"  # no driver and no GPU: nothing wrong
    assert all(c["detail"] for c in data["checks"] if c["status"] == "skip"), "a skip always says why"


def test_the_human_report_leads_with_the_summary_then_the_ranked_fixes(tmp_path: Path) -> None:
    code, _, out, err = doctor(scenarios.ecc_errors(), tmp_path, "--only", "gpu", "--no-color")
    assert code == 5, err
    lines = out.splitlines()
    assert lines[0].startswith("gpubox doctor (quick): ") and " failed" in lines[0]
    assert "Findings, most urgent first" in out
    assert out.index("Findings, most urgent first") < out.index("Every check")
    assert "\x1b[" not in out


def test_data_reads_are_measured_for_a_folder(tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    for i in range(5):
        (data / f"shard-{i}.bin").write_bytes(bytes([i]) * 200_000)
    os.mkfifo(data / "a-fifo")  # a FIFO among the files must not hang the reads
    code, doc, _, err = doctor(None, tmp_path, "--json", "--only", "data", "--data", str(data))
    assert code in (0, 5), err
    checks = by_id(doc)
    assert checks[("data.read", None)]["status"] in {"ok", "warn"}
    assert checks[("data.read", None)]["evidence"]
    assert checks[("data.filesystem", None)]["status"] in {"ok", "warn"}
    assert checks[("data.read", None)]["evidence"]["files"] == 5
    assert doc["data"]["benchmarks"] == {"transfer": None}  # a stable key, null when not run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "bogus"], "--only: unknown group 'bogus'"),
        (["--only", ","], "--only: name at least one group"),
        (["--gpu", "x"], "--gpu: expected GPU indexes"),
        (["--gpu", "-1"], "--gpu: GPU indexes start at 0"),
        (["--gpu", "\u0661"], "--gpu: expected GPU indexes"),  # an Arabic-Indic one: int() takes it, CUDA not
        (["--gpu", "1_0"], "--gpu: expected GPU indexes"),
        (["--only", "transfer", "--gpu", "5"], "--gpu: no GPU 5 on this box"),
        (["--python", "/nonexistent/python3"], "--python /nonexistent/python3"),
        (["--data", "/nonexistent/dataset"], "/nonexistent/dataset"),
        (["--data", ""], "--data '': an empty path"),  # not the current directory
        (["--data", " "], "--data ' ': an empty path"),
        (["--python", ""], "--python '': an empty path"),
        (["--python", FALSE], f"--python {FALSE}: not a working Python interpreter"),
        (["--python", TRUE], f"--python {TRUE}: not a working Python interpreter"),
        (["--only", "data"], "--only data: name the dataset with --data PATH"),
        (["loader", "no_colon_here"], "MODULE:FACTORY"),
        (["loader", "gpubox_no_such_module:make"], "gpubox_no_such_module"),
        (["loader", "tests/doctor/loader_targets.py:fast", "--device", "tpu"], "--device"),
        (["loader", ""], "MODULE:FACTORY"),
        (["loader", "no/such/train.py:make"], "there is no file no/such/train.py"),
        (["loader", "tests/doctor/loader_targets.py:fast", "--python", ""], "--python '': an empty path"),
        (["loader", "tests/doctor/loader_targets.py:fast", "--python", "/nonexistent/python3"], "no such file"),
        (["loader", "tests/doctor/loader_targets.py:fast", "--python", FALSE], "not a working Python interpreter"),
        (["loader", "tests/doctor/loader_targets.py:fast", "--python", TRUE], "not a working Python interpreter"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, args: list[str], message: str) -> None:
    code, _, out, err = doctor(scenarios.healthy(1), tmp_path, *args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("gpubox: ") and message in err, err
    assert "Traceback" not in err and out == ""


def test_bad_input_with_json_still_prints_an_envelope(tmp_path: Path) -> None:
    code, doc, _, _ = doctor(scenarios.healthy(1), tmp_path, "--json", "--only", "bogus")
    assert code == 2
    assert doc["ok"] is False and doc["data"] is None and "unknown group" in doc["errors"][0]


def test_an_empty_dataset_folder_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, _, err = doctor(None, tmp_path, "--data", str(empty))
    assert code == 2 and err.startswith("gpubox: ") and err.count("\n") == 1, err


def test_a_python_without_torch_is_a_finding_not_bad_input(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("a fresh virtual environment sees torch here")
    code, doc, _, err = doctor(scenarios.healthy(1), tmp_path, "--json", "--only", "driver", "--python", python)
    assert code in (0, 5), err
    torch_build = by_id(doc)[("driver.torch_build", None)]
    assert torch_build["status"] == "skip" and f"torch is not installed in {python}" in torch_build["detail"]
