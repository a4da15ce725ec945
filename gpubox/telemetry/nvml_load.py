"""Starting NVML, with one clear line when it cannot start: a module of its own, light to
import, for the commands that only need to know the GPUs (`queue add --gpus 1`)."""

from __future__ import annotations

from types import ModuleType

from gpubox.telemetry.backend import BackendUnavailable


def load_nvml() -> ModuleType:
    """Import pynvml and initialise NVML, or raise BackendUnavailable with one clear line."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise BackendUnavailable("the nvidia-ml-py package (pynvml) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound as exc:
        raise BackendUnavailable("no NVIDIA driver found (libnvidia-ml.so.1 is not installed)") from exc
    except pynvml.NVMLError_DriverNotLoaded as exc:
        raise BackendUnavailable("the NVIDIA kernel driver is not loaded") from exc
    except pynvml.NVMLError_NoPermission as exc:
        raise BackendUnavailable("no permission to open the NVIDIA devices (/dev/nvidia*)") from exc
    except pynvml.NVMLError as exc:
        raise BackendUnavailable(f"NVML failed to start: {exc}") from exc
    module: ModuleType = pynvml
    return module
