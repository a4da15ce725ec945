"""torch_bench.py run for real, with this environment's torch (a CPU build: no CUDA), with a Python
that has no torch, and through gpubox.doctor.interpreter's failures: bad paths, time-outs, crashes."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.doctor import interpreter, torch_bench
from gpubox.doctor.interpreter import InterpreterUnusable, ScriptRun, check_interpreter, run_script
from gpubox.doctor.library_checks import library_checks
from gpubox.doctor.model import GpuFacts, SystemFacts
from gpubox.doctor.torch_facts import torch_facts_from_run
from gpubox.exit_codes import ExitCode

SCRIPT = Path(torch_bench.__file__)


@pytest.fixture(scope="module")
def facts_run() -> ScriptRun:
    return run_script("torch_bench.py", ["facts"], timeout_s=120)


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("no-torch") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("a fresh virtual environment sees torch here")
    return python


def test_importing_the_script_does_not_import_torch() -> None:
    code = "import sys, gpubox.doctor.torch_bench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_cpu_lists_in_the_kernels_form() -> None:
    assert torch_bench.cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert torch_bench.cpu_list("5") == [5]
    for bad in ("", "3-1", "a", "0-x", "-1"):
        with pytest.raises(ValueError):
            torch_bench.cpu_list(bad)


def test_facts_with_a_cpu_build_say_there_is_no_cuda(facts_run: ScriptRun) -> None:
    assert facts_run.ok and facts_run.returncode == 0, facts_run
    data = facts_run.data
    assert data is not None and data["kind"] == "facts" and data["schema"] == 1
    assert isinstance(data["torch_version"], str) and data["torch_missing"] is False
    assert data["cuda_build"] is None and data["cuda_available"] is False
    assert "CPU-only" in data["cuda_error"]
    assert data["device_count"] == 0 and data["devices"] == [] and data["arch_list"] == []
    assert data["python"] == sys.executable


def test_facts_of_a_cpu_build_on_a_gpu_box_fail_the_torch_build(facts_run: ScriptRun) -> None:
    gpu = GpuFacts(index=0, uuid="GPU-0", name="NVIDIA H200", pci_bus_id=None, compute_capability=(9, 0))
    box = SystemFacts("570.124.06", 12080, gpus=(gpu,), nvidia_devices=True)
    checks = {c.id: c for c in library_checks(box, torch_facts_from_run(facts_run))}
    assert checks["driver.torch_build"].status == "fail"
    assert checks["driver.torch_build"].fix == (
        f"{shlex.quote(sys.executable)} -m pip install --force-reinstall torch "
        "--index-url https://download.pytorch.org/whl/cu128"
    )


def test_the_script_runs_on_its_own() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "facts"], capture_output=True, text=True, timeout=120, cwd=SCRIPT.parent
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kind"] == "facts"


def test_transfer_without_cuda_answers_with_the_reason() -> None:
    args = ["transfer", "--gpu", "0", "--cpus", "0", "--reps", "10", "--bytes", "4096", "--matmul", "64"]
    run = run_script("torch_bench.py", args, timeout_s=120)
    assert run.returncode == 0 and run.data is not None, run
    assert run.failure is not None and run.failure.startswith("CUDA is not available to torch")
    assert "CPU-only" in run.failure
    assert run.data["copies"] == {} and run.data["matmul"] is None and run.data["device"] is None
    assert run.data["affinity"] == {"requested": [0], "cpus": [0], "applied": True, "error": None}


def test_bad_arguments_are_a_crash_with_the_usage_line() -> None:
    run = run_script("torch_bench.py", ["transfer", "--cpus", "7-1"], timeout_s=60)
    assert run.data is None and run.returncode == 2
    assert run.failure is not None and "exited with code 2" in run.failure and "--cpus" in run.failure


def test_a_python_without_torch_gives_the_torch_missing_sentence(python_without_torch: str) -> None:
    run = run_script("torch_bench.py", ["facts"], python=python_without_torch, timeout_s=60)
    # Named with --python already: the advice checks that choice rather than asking for --python.
    assert run.failure == (
        f"torch is not installed in {python_without_torch}; is it the interpreter of your training environment?"
    )
    assert run.data is not None and run.data["torch_missing"] is True
    facts = torch_facts_from_run(run)
    assert facts.torch_missing and facts.torch_error == run.failure
    transfer = run_script("torch_bench.py", ["transfer"], python=python_without_torch, timeout_s=60)
    assert transfer.failure == run.failure


def test_a_bad_python_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(InterpreterUnusable) as missing:
        check_interpreter(str(tmp_path / "nope" / "python"))
    assert missing.value.code == ExitCode.USAGE
    assert missing.value.message == f"--python {tmp_path / 'nope' / 'python'}: no such file"
    with pytest.raises(InterpreterUnusable, match="not found on PATH"):
        check_interpreter("no-such-python-anywhere")
    with pytest.raises(InterpreterUnusable, match="is a directory"):
        check_interpreter(str(tmp_path))
    plain = tmp_path / "python"
    plain.write_text("not a program\n")
    with pytest.raises(InterpreterUnusable, match="not executable"):
        check_interpreter(str(plain))
    # executable, but not something the kernel can run
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(InterpreterUnusable, match=r"--python .*: Exec format error"):
        run_script("torch_bench.py", ["facts"], python=str(plain))
    with pytest.raises(InterpreterUnusable):
        run_script("torch_bench.py", ["facts"], python=str(tmp_path / "missing"))


def program(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("exit 1", "not a working Python interpreter (asked for its version, it exited with code 1)"),  # /bin/false
        ("exit 0", "not a working Python interpreter (asked for its version, it printed nothing)"),  # /bin/true
        ("echo hello", "not a working Python interpreter (asked for its version, it printed no version)"),
        (
            "echo 'Fatal Python error: init_fs_encoding' >&2\n"
            "echo \"ModuleNotFoundError: No module named 'encodings'\" >&2\nexit 1",
            "(asked for its version, it exited with code 1: ModuleNotFoundError: No module named 'encodings')",
        ),
        ("kill -SEGV $$", "(asked for its version, it was killed by SIGSEGV)"),
        ("echo gpubox-python 2.7", "Python 2.7 is too old: the benchmarks need 3.8 or later"),
    ],
)
def test_a_program_that_is_no_working_python_is_a_usage_error(tmp_path: Path, body: str, why: str) -> None:
    python = program(tmp_path, body)
    with pytest.raises(InterpreterUnusable) as caught:
        check_interpreter(python)
    assert caught.value.code == ExitCode.USAGE
    assert caught.value.message.startswith(f"--python {python}: ") and caught.value.message.endswith(why)
    assert "\n" not in caught.value.message


def test_an_interpreter_that_does_not_answer_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "VERSION_TIMEOUT_S", 0.5)
    with pytest.raises(InterpreterUnusable, match=r"did not answer within 0\.5 s when asked for its version"):
        check_interpreter(program(tmp_path, "exec sleep 30"))


def test_a_working_python_passes_with_or_without_torch(python_without_torch: str) -> None:
    # torch missing is a finding of the report, not bad input
    assert check_interpreter(python_without_torch) == python_without_torch
    assert check_interpreter(sys.executable) == sys.executable


def test_a_venv_folder_gets_a_hint(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    inside = tmp_path / "bin" / "python"
    inside.symlink_to(sys.executable)
    with pytest.raises(InterpreterUnusable, match=re.escape(f"did you mean {inside}?")):
        check_interpreter(str(tmp_path))
    assert check_interpreter(str(inside)) == str(inside)  # the venv's link is kept, not resolved


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "child.py"
    path.write_text(body)
    return path


def test_a_script_that_runs_too_long_is_killed(tmp_path: Path) -> None:
    slow = script(tmp_path, "import time\ntime.sleep(60)\n")
    run = run_script(slow, ["facts"], timeout_s=0.5)
    assert run.failure == f"child.py facts timed out after 0.5 s under {sys.executable}"
    assert run.returncode is None and run.data is None


def test_a_crash_gives_the_last_line_of_stderr(tmp_path: Path) -> None:
    crash = script(tmp_path, "import warnings\nwarnings.warn('noise')\nraise RuntimeError('CUDA error: boom')\n")
    run = run_script(crash, ["transfer"])
    assert run.returncode == 1 and run.data is None
    assert run.failure == f"child.py transfer exited with code 1 under {sys.executable} without an answer: " + (
        "RuntimeError: CUDA error: boom"
    )


def test_a_crash_with_a_multi_line_error_gives_its_exception_line(tmp_path: Path) -> None:
    message = "CUDA error: device-side assert triggered\\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    crash = script(tmp_path, f"print('loading', flush=True)\nraise RuntimeError('{message}')\n")
    run = run_script(crash, ["transfer"])
    assert run.failure == f"child.py transfer exited with code 1 under {sys.executable} without an answer: " + (
        "RuntimeError: CUDA error: device-side assert triggered"
    )


def test_a_signal_names_itself(tmp_path: Path) -> None:
    killed = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    run = run_script(killed, ["facts"])
    assert run.failure is not None and run.failure.startswith("child.py facts was killed by SIGSEGV")


def test_what_the_environment_prints_before_the_answer_is_ignored(tmp_path: Path) -> None:
    chatty = script(tmp_path, "print('hello from sitecustomize')\nprint('{not json')\nprint('{\"kind\": \"facts\"}')\n")
    run = run_script(chatty, ["facts"], env={**os.environ, "EXTRA": "1"})
    assert run.ok and run.data == {"kind": "facts"}


def test_an_error_in_the_answer_is_the_failure(tmp_path: Path) -> None:
    erring = script(tmp_path, "import json\nprint(json.dumps({'kind': 'transfer', 'error': 'torch sees 1 GPU(s)'}))\n")
    run = run_script(erring, ["transfer"])
    assert run.failure == "torch sees 1 GPU(s)" and run.data is not None


def test_the_environment_reaches_the_script(tmp_path: Path) -> None:
    echo = script(tmp_path, "import json, os\nprint(json.dumps({'seen': os.environ.get('CUDA_VISIBLE_DEVICES')}))\n")
    run = run_script(echo, [], env={**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-1234"})
    assert run.data == {"seen": "GPU-1234"}


# A stand-in for a CUDA build of torch with the calls torch_bench.py makes, as the PyTorch docs give
# them; strict where the real one is (pinned memory only on the host, timing only from timing events),
# so the CUDA path runs here without a GPU. Timings are made up: only the shape of the answer counts.
FAKE_TORCH = """
import itertools
__version__ = "2.5.1+cu124"
uint8, bfloat16, float16 = "torch.uint8", "torch.bfloat16", "torch.float16"
class version:
    cuda = "12.4"
    hip = None
class _C:
    @staticmethod
    def _cuda_getArchFlags():
        return "sm_80 sm_90"
def device(kind, index):
    assert kind == "cuda" and isinstance(index, int)
    return (kind, index)
class Tensor:
    def __init__(self, nbytes, on_gpu, pinned=False):
        self.nbytes, self.on_gpu, self.pinned = nbytes, on_gpu, pinned
    def fill_(self, value):
        return self
    def copy_(self, src, non_blocking=False):
        assert isinstance(src, Tensor) and src.nbytes == self.nbytes
        assert not non_blocking or (src.pinned or self.pinned), "non_blocking without pinned memory"
        return self
def empty(*size, dtype=None, device=None, pin_memory=False):
    assert not (pin_memory and device is not None), "only host memory can be pinned"
    assert pin_memory is False or cuda.initialized
    return Tensor(size[0], device is not None, pin_memory)
def randn(*size, device=None, dtype=None):
    assert dtype in (bfloat16, float16) and device is not None
    return Tensor(size[0], True)
def matmul(a, b, out=None):
    assert out is not None and a.on_gpu and b.on_gpu
    return out
_clock = itertools.count()
class _Props:
    name = "NVIDIA H200"
    total_memory = 150 * 2**30
    multi_processor_count = 132
    uuid = "6fc5ba4a-3d0e-11ef-8e9b-0242ac120002"
    pci_domain_id, pci_bus_id, pci_device_id = 0, 0x18, 0
class cuda:
    initialized = False
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def init():
        cuda.initialized = True
    @staticmethod
    def device_count():
        return 1
    @staticmethod
    def set_device(index):
        assert index == 0
        cuda.initialized = True
    @staticmethod
    def get_arch_list():
        return ["sm_80", "sm_90"]
    @staticmethod
    def get_device_capability(index):
        return (9, 0)
    @staticmethod
    def get_device_properties(index):
        return _Props()
    @staticmethod
    def synchronize():
        pass
    class Event:
        def __init__(self, enable_timing=False):
            self.enable_timing, self.at = enable_timing, None
        def record(self):
            self.at = next(_clock)
        def elapsed_time(self, end):
            assert self.enable_timing and end.enable_timing and self.at is not None and end.at is not None
            return 5.0 * (end.at - self.at)  # milliseconds
"""


@pytest.fixture
def cuda_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}


def test_facts_from_a_cuda_build(cuda_env: dict[str, str]) -> None:
    run = run_script("torch_bench.py", ["facts"], env=cuda_env, timeout_s=60)
    assert run.ok and run.data is not None, run
    assert run.data["cuda_available"] is True and run.data["cuda_build"] == "12.4"
    assert run.data["arch_list"] == ["sm_80", "sm_90"]
    assert run.data["devices"] == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "capability": [9, 0],
            "memory_total_bytes": 150 * 2**30,
            "multiprocessors": 132,
            "uuid": "GPU-6fc5ba4a-3d0e-11ef-8e9b-0242ac120002",
            "pci_bus_id": "0000:18:00.0",
        }
    ]


def test_transfer_on_a_cuda_build_answers_what_transfer_reads(cuda_env: dict[str, str]) -> None:
    from gpubox.doctor.thresholds import Thresholds
    from gpubox.doctor.transfer import PcieLink, copy_window, transfer_result
    from gpubox.doctor.transfer_checks import transfer_checks

    args = ["transfer", "--gpu", "0", "--cpus", "0", "--reps", "10", "--bytes", str(10**9), "--matmul", "1000"]
    run = run_script("torch_bench.py", args, env=cuda_env, timeout_s=60)
    assert run.ok and run.data is not None, run
    copies = run.data["copies"]
    assert set(copies) == {"h2d_pageable", "d2h_pageable", "h2d_pinned", "d2h_pinned", "d2d"}
    for name, copy in copies.items():
        assert copy["error"] is None and copy["bytes"] == 10**9 and len(copy["seconds"]) == 10, name
        assert copy["timer"] == ("wall" if name.endswith("pageable") else "cuda_event")
        assert copy["started_at"] <= copy["ended_at"]
    assert copies["h2d_pinned"]["seconds"] == [0.005] * 10  # 5 ms between paired events
    matmul = run.data["matmul"]
    assert matmul["dtype"] == "bfloat16" and matmul["flops"] == 2 * 1000**3 * 10 and len(matmul["seconds"]) == 10
    result = transfer_result(run.data, gpu=0, link_now=PcieLink(5, 16), link_max=PcieLink(5, 16))
    assert result.device_name == "NVIDIA H200" and result.affinity_cpus == (0,)
    assert result.h2d_pinned.gb_per_s == pytest.approx(200.0)
    assert result.matmul.tflops == pytest.approx(4.0)
    assert all(c.status != "skip" for c in transfer_checks(result, Thresholds()))
    window = copy_window(run.data)
    assert window is not None and window[0] <= window[1]


@pytest.fixture
def broken_torch_env(tmp_path: Path) -> dict[str, str]:
    """A torch that is installed but fails inside its import, as one missing its CUDA runtime does."""
    (tmp_path / "broken" / "torch").mkdir(parents=True)
    (tmp_path / "broken" / "torch" / "__init__.py").write_text(
        'raise ImportError("libcudart.so.12: cannot open shared object file")\n'
    )
    return {**os.environ, "PYTHONPATH": str(tmp_path / "broken")}


def test_a_broken_torch_is_installed_but_cannot_be_imported(broken_torch_env: dict[str, str]) -> None:
    cause = "ImportError: libcudart.so.12: cannot open shared object file"
    sentence = f"torch is installed in {sys.executable} but cannot be imported: {cause}"
    run = run_script("torch_bench.py", ["facts"], env=broken_torch_env, timeout_s=60)
    assert run.failure == sentence
    assert run.data is not None and run.data["torch_missing"] is False and run.data["torch_error"] == cause
    facts = torch_facts_from_run(run)
    assert not facts.torch_missing and facts.torch_error == sentence
    transfer = run_script("torch_bench.py", ["transfer"], env=broken_torch_env, timeout_s=60)
    assert transfer.failure == sentence
    assert transfer.data is not None and transfer.data["error"] == f"torch is installed but cannot be imported: {cause}"
