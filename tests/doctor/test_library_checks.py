"""The driver checks on controlled facts: old driver under a new torch build, a CPU-only torch on a
GPU box, kernels present, compatible, PTX only or missing, no NVML, no torch."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpubox.doctor.findings import exit_code
from gpubox.doctor.interpreter import ScriptRun
from gpubox.doctor.library_checks import (
    NO_KERNEL,
    arch_checks,
    cuda_vs_torch_check,
    library_checks,
    nvml_check,
    torch_build_check,
)
from gpubox.doctor.model import Check, GpuFacts, SystemFacts
from gpubox.doctor.torch_facts import TorchFacts, torch_facts_from, torch_facts_from_run
from gpubox.exit_codes import ExitCode

HOPPER_ARCHES = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def gpu(index: int = 0, name: str = "NVIDIA H100 80GB HBM3", cap: tuple[int, int] | None = (9, 0)) -> GpuFacts:
    return GpuFacts(index=index, uuid=f"GPU-{index}", name=name, pci_bus_id=None, compute_capability=cap)


def box(driver: str = "550.54.15", cuda: int | None = 12040, gpus: tuple[GpuFacts, ...] | None = None) -> SystemFacts:
    return SystemFacts(
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=(gpu(),) if gpus is None else gpus,
        nvidia_devices=True,
    )


def torch(**overrides: Any) -> TorchFacts:
    data: dict[str, Any] = {
        "kind": "facts",
        "python": "/venv/bin/python",
        "python_version": "3.11.9",
        "torch_version": "2.5.1+cu124",
        "torch_missing": False,
        "torch_error": None,
        "cuda_build": "12.4",
        "hip_build": None,
        "cuda_available": True,
        "cuda_error": None,
        "cuda_visible_devices": None,
        "device_count": 1,
        "arch_list": HOPPER_ARCHES,
        "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "uuid": "GPU-0"}],
        "error": None,
    }
    data.update(overrides)
    return torch_facts_from(data)


def only(checks: list[Check]) -> Check:
    assert len(checks) == 1, checks
    return checks[0]


def test_a_healthy_box_is_all_ok() -> None:
    checks = library_checks(box(), torch())
    assert [c.id for c in checks] == ["driver.nvml", "driver.torch_build", "driver.cuda_vs_torch", "driver.arch"]
    assert all(c.status == "ok" and c.category == "driver" for c in checks), checks
    assert "550.54.15" in checks[0].detail and "CUDA 12.4" in checks[0].detail


def test_a_torch_for_a_newer_cuda_major_than_the_driver_fails() -> None:
    check = cuda_vs_torch_check(box(driver="470.182.03", cuda=11040), torch(cuda_build="12.1"))
    assert check.status == "fail" and check.impact == 1.0
    assert "CUDA 12.1" in check.detail and "CUDA 11.4" in check.detail
    assert check.fix is not None and "525.60.13" in check.fix and "530.30.02" in check.fix
    # no wheel index is as old as CUDA 11.4: the driver has to move
    assert "pip install" not in check.fix


def test_an_old_driver_gets_an_upgrade_before_the_install_line() -> None:
    cpu = torch(torch_version="2.5.1+cpu", cuda_build=None, cuda_available=False, arch_list=[])
    fix = torch_build_check(box(driver="470.182.03", cuda=11040), cpu).fix
    assert fix == (
        "upgrade the NVIDIA driver to ≥ 520.61.05 (CUDA 11.8), then "
        "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu118"
    )


def test_an_old_driver_gets_the_newest_wheel_it_runs() -> None:
    check = cuda_vs_torch_check(box(driver="520.61.05", cuda=11080), torch(cuda_build="12.4"))
    assert check.status == "fail"
    assert check.fix is not None and "or install a torch built for the driver's CUDA: " in check.fix
    assert check.fix.endswith(
        "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu118"
    )


def test_a_newer_minor_runs_under_minor_version_compatibility() -> None:
    facts = box(driver="535.104.05", cuda=12020)
    check = cuda_vs_torch_check(facts, torch(cuda_build="12.4"))
    assert check.status == "ok" and "minor-version compatibility" in check.meaning and "525.60.13" in check.meaning
    # a GPU that has only PTX in the build needs the JIT that this driver cannot do for CUDA 12.4 PTX
    blackwell = box(driver="535.104.05", cuda=12020, gpus=(gpu(name="NVIDIA RTX PRO 6000", cap=(12, 0)),))
    warned = cuda_vs_torch_check(blackwell, torch(cuda_build="12.4", arch_list=[*HOPPER_ARCHES, "compute_90"]))
    assert warned.status == "warn" and warned.fix is not None and "550.54.14" in warned.fix


def test_a_driver_newer_than_the_build_is_fine() -> None:
    check = cuda_vs_torch_check(box(driver="570.124.06", cuda=12080), torch(cuda_build="11.8"))
    assert check.status == "ok" and check.fix is None


def test_the_cuda_check_skips_without_what_it_compares() -> None:
    assert cuda_vs_torch_check(box(cuda=None), torch()).status == "skip"
    assert cuda_vs_torch_check(box(), torch(cuda_build=None)).status == "skip"


def test_a_cpu_only_torch_on_a_gpu_box_fails_with_the_install_line() -> None:
    facts = box(driver="550.54.15", cuda=12040, gpus=(gpu(0), gpu(1)))
    cpu = torch(torch_version="2.5.1+cpu", cuda_build=None, cuda_available=False, arch_list=[], devices=[])
    check = torch_build_check(facts, cpu)
    assert check.status == "fail" and check.impact == 1.0
    assert "CPU-only" in check.detail and "2 NVIDIA GPU(s)" in check.detail and "/venv/bin/python" in check.detail
    assert (
        check.fix
        == "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"
    )
    newer = torch_build_check(box(driver="570.124.06", cuda=12080), cpu)
    assert (
        newer.fix
        == "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128"
    )
    # the other torch checks say why they have nothing to look at
    assert cuda_vs_torch_check(facts, cpu).status == "skip"
    assert {c.status for c in arch_checks(facts, cpu)} == {"skip"}


def test_a_blackwell_gpu_needs_cuda_12_8_wheels() -> None:
    facts = box(driver="560.35.03", cuda=12060, gpus=(gpu(name="NVIDIA GeForce RTX 5090", cap=(12, 0)),))
    cpu = torch(torch_version="2.5.1+cpu", cuda_build=None, cuda_available=False, arch_list=[])
    fix = torch_build_check(facts, cpu).fix
    assert fix is not None and "≥ 570.26" in fix and "whl/cu128" in fix


def test_a_volta_gpu_gets_wheels_that_still_carry_its_kernels() -> None:
    facts = box(driver="580.65.06", cuda=13000, gpus=(gpu(name="Tesla V100-SXM2-32GB", cap=(7, 0)),))
    cpu = torch(torch_version="2.5.1+cpu", cuda_build=None, cuda_available=False, arch_list=[])
    assert (
        torch_build_check(facts, cpu).fix
        == "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu126"
    )
    hopper = box(driver="580.65.06", cuda=13000)
    assert (
        torch_build_check(hopper, cpu).fix
        == "/venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu130"
    )


def test_a_cpu_only_torch_without_gpus_is_not_a_finding() -> None:
    facts = SystemFacts(None, None, nvml_error="NVML Shared Library Not Found", nvidia_devices=False)
    cpu = torch(torch_version="2.5.1+cpu", cuda_build=None, cuda_available=False, arch_list=[])
    assert torch_build_check(facts, cpu).status == "skip"


def test_a_cuda_build_that_cannot_use_cuda_fails_with_the_reason() -> None:
    hidden = torch(cuda_available=False, cuda_error="RuntimeError: No CUDA GPUs are available", cuda_visible_devices="")
    check = torch_build_check(box(), hidden)
    assert check.status == "fail" and "No CUDA GPUs are available" in check.detail
    assert check.fix is not None and "CUDA_VISIBLE_DEVICES=''" in check.fix


def test_arch_present_compatible_ptx_and_missing() -> None:
    gpus = (
        gpu(0, "NVIDIA H100 80GB HBM3", (9, 0)),
        gpu(1, "NVIDIA GeForce RTX 4090", (8, 9)),
        gpu(2, "NVIDIA GeForce RTX 5090", (12, 0)),
    )
    with_ptx = arch_checks(box(gpus=gpus), torch(arch_list=[*HOPPER_ARCHES, "compute_90"]))
    assert [(c.gpu, c.status, c.evidence["uses"]) for c in with_ptx] == [
        (0, "ok", "sm_90"),
        (1, "ok", "sm_86"),  # sm_86 binaries run on 8.9
        (2, "warn", "compute_90"),
    ]
    assert "binary-compatible" in with_ptx[1].detail
    assert "compute_90" in with_ptx[2].detail and with_ptx[2].fix is not None and "cu128" in with_ptx[2].fix
    without = arch_checks(box(driver="570.124.06", cuda=12080, gpus=gpus), torch(arch_list=HOPPER_ARCHES))
    assert [c.status for c in without] == ["ok", "ok", "fail"]
    assert NO_KERNEL in without[2].meaning and "sm_120" in without[2].fix  # type: ignore[operator]
    assert "whl/cu128" in without[2].fix  # type: ignore[operator]


def test_arch_specific_code_runs_only_on_its_own_gpu() -> None:
    assert only(arch_checks(box(), torch(arch_list=["sm_80", "sm_90a"]))).status == "ok"
    hopper_only = torch(arch_list=["sm_90a"])
    ampere = box(gpus=(gpu(name="NVIDIA A100-SXM4-80GB", cap=(8, 0)),))
    assert only(arch_checks(ampere, hopper_only)).status == "fail"


def test_a_gpu_older_than_the_build_says_the_build_dropped_it() -> None:
    pascal = box(gpus=(gpu(name="Tesla P100-PCIE-16GB", cap=(6, 0)),))
    check = only(arch_checks(pascal, torch(arch_list=["sm_75", "sm_80", "sm_86", "sm_90"])))
    assert check.status == "fail" and check.fix is not None and "no longer builds for sm_60" in check.fix


def test_arch_uses_torch_devices_when_nvml_gives_no_capability() -> None:
    check = only(arch_checks(box(gpus=(gpu(cap=None),)), torch()))
    assert check.status == "ok" and check.gpu == 0


def test_arch_skips_when_torch_cannot_list_its_architectures() -> None:
    check = only(arch_checks(box(), torch(arch_list=[], cuda_available=False, cuda_error="driver too old")))
    assert check.status == "skip" and "driver too old" in check.detail


def test_no_nvml_on_a_box_with_nvidia_gpus_fails() -> None:
    facts = SystemFacts(None, None, nvml_error="NVML Shared Library Not Found", nvidia_devices=True)
    check = nvml_check(facts)
    assert check.status == "fail" and "libnvidia-ml.so.1" in (check.fix or "")
    mismatch = nvml_check(SystemFacts(None, None, nvml_error="Driver/library version mismatch", nvidia_devices=True))
    assert mismatch.status == "fail" and "reboot" in (mismatch.fix or "") and mismatch.impact == 1.0


def test_no_nvml_on_a_box_without_gpus_is_a_skip() -> None:
    facts = SystemFacts(None, None, nvml_error="NVML Shared Library Not Found", nvidia_devices=False)
    check = nvml_check(facts)
    assert check.status == "skip" and "no NVIDIA GPU" in check.detail
    no_torch = TorchFacts.unavailable("torch is not installed in /usr/bin/python3", missing=True)
    assert {c.status for c in library_checks(facts, no_torch)} == {"skip"}


def test_torch_missing_skips_every_torch_check_with_the_reason() -> None:
    why = "torch is not installed in /usr/bin/python3; pass --python with the interpreter of your training environment"
    checks = library_checks(box(gpus=(gpu(0), gpu(1))), TorchFacts.unavailable(why, "/usr/bin/python3", missing=True))
    assert checks[0].status == "ok"
    torch_checks = checks[1:]
    assert [c.id for c in torch_checks] == ["driver.torch_build", "driver.cuda_vs_torch", "driver.arch", "driver.arch"]
    assert all(c.status == "skip" and c.detail == why for c in torch_checks)
    assert [c.gpu for c in torch_checks[2:]] == [0, 1]


def test_a_torch_that_cannot_be_imported_on_a_gpu_box_fails_with_a_reinstall() -> None:
    # As torch_bench.py facts reports a torch whose import raised; the run's sentence names the interpreter.
    data = {"kind": "facts", "python": "/venv/bin/python", "torch_missing": False, "torch_error": "ImportError: x"}
    sentence = "torch is installed in /venv/bin/python but cannot be imported: ImportError: x"
    broken = torch_facts_from_run(ScriptRun("/venv/bin/python", ("torch_bench.py", "facts"), data, sentence, 0, 0.1))
    checks = library_checks(box(), broken)
    build = checks[1]
    assert build.status == "fail" and build.impact == 1.0 and build.detail == sentence
    assert build.fix is not None and "/venv/bin/python -c 'import torch'" in build.fix
    assert "/venv/bin/python -m pip install --force-reinstall torch --index-url" in build.fix
    assert exit_code(checks, False) == ExitCode.CHECK_FAILED
    assert [c.status for c in checks[2:]] == ["skip", "skip"]  # nothing more to say of a torch that does not load
    # without a GPU, torch's CUDA build is not in question
    no_gpu = SystemFacts(None, None, nvml_error="NVML Shared Library Not Found", nvidia_devices=False)
    assert torch_build_check(no_gpu, broken).status == "skip"
    # a run that timed out says nothing about the install: still a skip
    timed_out = torch_facts_from_run(ScriptRun("/x/python", ("torch_bench.py", "facts"), None, "timed out", None, 90))
    assert torch_build_check(box(), timed_out).status == "skip"


def test_no_torch_facts_at_all_is_a_skip() -> None:
    checks = library_checks(box(), None)
    assert [c.status for c in checks] == ["ok", "skip", "skip", "skip"]


def test_facts_from_a_run_take_the_runs_sentence() -> None:
    missing = {"kind": "facts", "torch_missing": True, "torch_error": "ModuleNotFoundError: No module named 'torch'"}
    sentence = "torch is not installed in /usr/bin/python3; pass --python ..."
    run = ScriptRun("/usr/bin/python3", ("torch_bench.py", "facts"), missing, sentence, 0, 0.1)
    facts = torch_facts_from_run(run)
    assert facts.torch_missing and facts.torch_error == sentence
    timed_out = ScriptRun("/x/python", ("torch_bench.py", "facts"), None, "timed out after 60 s", None, 60.0)
    assert torch_facts_from_run(timed_out).torch_error == "timed out after 60 s"


def test_facts_of_the_wrong_shape_read_as_unknown() -> None:
    facts = torch_facts_from(
        {"kind": "facts", "devices": [{"index": "x"}, 3], "arch_list": "sm_90", "device_count": "2"}
    )
    assert facts.devices == () and facts.arch_list == () and facts.device_count == 0 and not facts.cuda_available


def test_the_install_line_replaces_the_torch_in_the_interpreter_it_checked() -> None:
    # torch is installed whenever these lines are given, and `pip install torch` is satisfied by any
    # installed torch ("2.5.1+cpu" too): without a forced reinstall the line changes nothing. And
    # it must reach the environment that was checked (--python), not whatever pip is first on PATH.
    facts = box(driver="550.54.15", cuda=12040)
    cpu = torch(
        python="/home/ann/envs/train/bin/python",
        torch_version="2.5.1+cpu",
        cuda_build=None,
        cuda_available=False,
        arch_list=[],
    )
    assert torch_build_check(facts, cpu).fix == (
        "/home/ann/envs/train/bin/python -m pip install --force-reinstall torch "
        "--index-url https://download.pytorch.org/whl/cu124"
    )
    old = cuda_vs_torch_check(box(driver="520.61.05", cuda=11080), torch(cuda_build="12.4", python="/opt/my env/py"))
    assert old.fix is not None
    assert old.fix.endswith(
        "'/opt/my env/py' -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu118"
    )


def test_nvmls_sentence_inside_brackets_loses_its_full_stop() -> None:
    # Not "… is not installed).)": the sentence is set inside the detail's brackets.
    error = "NVML cannot start: no NVIDIA driver found (libnvidia-ml.so.1 is not installed)."
    check = nvml_check(SystemFacts(None, None, nvml_error=error, nvidia_devices=False))
    assert check.status == "skip"
    assert check.detail == (
        "no NVIDIA GPU on this box (NVML cannot start: no NVIDIA driver found (libnvidia-ml.so.1 is not installed))"
    )


def test_a_gpu_that_fell_off_the_bus_fails_the_driver_check() -> None:
    # NVML lists GPU 1 but answers "GPU is lost" for all of it: its own checks can only skip, so
    # without this the run would end "nothing to fix" with exit 0.
    lost = dataclasses.replace(gpu(1), missing=dict.fromkeys(("name", "temperature_c"), "gpu_lost"))
    check = nvml_check(box(gpus=(gpu(0), lost)))
    assert check.status == "fail" and check.impact == 1.0
    assert "GPU 1 fell off the bus" in check.detail and "GPU 0" not in check.detail
    assert check.fix is not None and "xid" in check.fix.lower() and "reboot" in check.fix
    assert exit_code([check], no_gpu_but_asked=False) == ExitCode.CHECK_FAILED
    # a figure the GPU merely does not support is no fault
    unsupported = dataclasses.replace(gpu(1), missing={"temperature_c": "not_supported"})
    assert nvml_check(box(gpus=(gpu(0), unsupported))).status == "ok"
