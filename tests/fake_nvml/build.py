"""Compile the fake NVML library (fake_nvml.c) into libnvidia-ml.so.1.

Each build lands in its own directory, named by variant and a hash of the source and flags, so a
changed source never reuses a stale library and an unchanged one is built once. Concurrent
callers (pytest-xdist workers, parallel test runs) each compile into a private temporary file and
rename it into place; the last rename wins and every reader sees a complete library.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
BUILD_ROOT = HERE / "build"
LIB_NAME = "libnvidia-ml.so.1"

VARIANTS: dict[str, tuple[str, ...]] = {
    "full": (),
    # A driver from before GPM, the clocks-event-reasons rename and nvmlDeviceGetFieldValues.
    "old_driver": ("-DOLD_DRIVER",),
}

CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-fvisibility=hidden")


class FakeNvmlBuildError(RuntimeError):
    """The C compiler is missing or rejected the source."""


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise FakeNvmlBuildError("no C compiler (cc, gcc or clang) on PATH")


def build_fake_nvml(variant: str = "full") -> Path:
    """Build (or reuse) the fake library; return the directory to put on LD_LIBRARY_PATH."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown fake NVML variant {variant!r}; known: {sorted(VARIANTS)}")
    flags = CFLAGS + VARIANTS[variant]
    digest = hashlib.sha256(SOURCE.read_bytes() + "\0".join(flags).encode()).hexdigest()[:16]
    out_dir = BUILD_ROOT / f"{variant}-{digest}"
    lib = out_dir / LIB_NAME
    if lib.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{LIB_NAME}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [_compiler(), *flags, "-o", str(tmp), str(SOURCE), "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise FakeNvmlBuildError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    return out_dir


def library_path(variant: str = "full") -> Path:
    """The built libnvidia-ml.so.1 itself, for ctypes.CDLL in the test process."""
    return build_fake_nvml(variant) / LIB_NAME


def fake_nvml_env(
    scenario_path: str | os.PathLike[str], variant: str = "full", base: dict[str, str] | None = None
) -> dict[str, str]:
    """An environment for a child process that loads the fake through pynvml's CDLL call."""
    env = dict(os.environ if base is None else base)
    lib_dir = str(build_fake_nvml(variant))
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = lib_dir if not old else f"{lib_dir}{os.pathsep}{old}"
    env["FAKE_NVML_SCENARIO"] = str(scenario_path)
    return env


if __name__ == "__main__":  # pragma: no cover - a convenience for benchmarks and by-hand runs
    import sys

    for name in sys.argv[1:] or ["full"]:
        print(build_fake_nvml(name))
