"""scripts/gpu-check.sh on a machine without a usable GPU: one clear line and exit 1, before it
installs anything into the Python it was given."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cuda_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda_usable(), reason="a usable GPU: the script would run its real checks")
def test_gpu_check_without_a_gpu_says_what_it_needs(tmp_path: Path) -> None:
    # A Python that has gpubox but no CUDA (this suite's): the old script went on to a traceback.
    env = {**os.environ, "PYTHON": sys.executable, "PATH": os.environ.get("PATH", "")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpu-check: needs torch with CUDA and a GPU it can use, importable by {sys.executable} (set PYTHON=...)"
    )


def test_gpu_check_refuses_a_python_without_torch_before_installing(tmp_path: Path) -> None:
    # A bare interpreter (no torch, no gpubox) that logs how it is called: refused before the
    # script runs `pip install` with it.
    calls = tmp_path / "calls"
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    env = {**os.environ, "PYTHON": str(bare)}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "needs torch with CUDA" in done.stderr
    assert calls.read_text().strip(), "the script never ran the given Python"
    assert "pip" not in calls.read_text()
