"""Whether the kernel knows NVIDIA GPUs, whatever NVML says: a box whose driver module is loaded
or has /dev/nvidiaN nodes has GPUs, even while NVML cannot read them (a driver being upgraded,
a library missing), and then GPU work must wait rather than run without them."""

from __future__ import annotations

import os
from pathlib import Path


def nvidia_devices_present(root: str | os.PathLike[str] = "/") -> bool:
    base = Path(root)
    if (base / "proc/driver/nvidia").exists():
        return True
    try:
        return any(p.name[len("nvidia") :].isdigit() for p in (base / "dev").glob("nvidia*"))
    except OSError:
        return False
