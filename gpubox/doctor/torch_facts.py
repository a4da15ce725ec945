"""What torch in the training environment says about itself and the GPUs it sees: TorchFacts and
TorchDevice, read from the JSON of torch_bench.py facts (torch_facts_from), from a run of it
(torch_facts_from_run), or by running it (read_torch_facts). library_checks.py and transfer_run.py
judge them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpubox.doctor.interpreter import ScriptRun


@dataclass(frozen=True)
class TorchDevice:
    index: int  # torch's device index
    name: str
    capability: tuple[int, int] | None
    uuid: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class TorchFacts:
    """torch in the training environment; `torch_error` says why it could not be read."""

    python: str | None
    python_version: str | None
    torch_version: str | None
    cuda_build: str | None  # torch.version.cuda: "12.4"; None on a CPU (or ROCm) build
    hip_build: str | None
    cuda_available: bool
    cuda_error: str | None  # why torch cannot use CUDA
    cuda_visible_devices: str | None  # as the environment set it
    device_count: int
    arch_list: tuple[str, ...]  # torch.cuda.get_arch_list(): "sm_90", "compute_90", ...
    devices: tuple[TorchDevice, ...]
    torch_missing: bool = False
    torch_error: str | None = None
    torch_broken: bool = False  # installed, but its import raised: unlike a missing one, a fault of the environment

    @classmethod
    def unavailable(cls, why: str, python: str | None = None, missing: bool = False) -> TorchFacts:
        return cls(python, None, None, None, None, False, None, None, 0, (), (), missing, why)


def torch_facts_from(data: Mapping[str, Any]) -> TorchFacts:
    """The record from torch_bench.py facts' JSON; a field of the wrong type reads as unknown."""
    devices = []
    for raw in data.get("devices") or ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("index"), int):
            continue
        cap = raw.get("capability")
        devices.append(
            TorchDevice(
                index=raw["index"],
                name=str(raw.get("name") or "?"),
                capability=(int(cap[0]), int(cap[1])) if isinstance(cap, list) and len(cap) == 2 else None,
                uuid=_text(raw.get("uuid")),
                pci_bus_id=_text(raw.get("pci_bus_id")),
                memory_total_bytes=_count(raw.get("memory_total_bytes")),
            )
        )
    arches = data.get("arch_list")
    count = data.get("device_count")
    return TorchFacts(
        python=_text(data.get("python")),
        python_version=_text(data.get("python_version")),
        torch_version=_text(data.get("torch_version")),
        cuda_build=_text(data.get("cuda_build")),
        hip_build=_text(data.get("hip_build")),
        cuda_available=data.get("cuda_available") is True,
        cuda_error=_text(data.get("cuda_error")),
        cuda_visible_devices=_text(data.get("cuda_visible_devices"), empty_ok=True),
        device_count=count if isinstance(count, int) else 0,
        arch_list=tuple(str(a) for a in arches) if isinstance(arches, list) else (),
        devices=tuple(devices),
        torch_missing=data.get("torch_missing") is True,
        torch_error=_text(data.get("torch_error")) or _text(data.get("error")),
        torch_broken=data.get("torch_missing") is not True and bool(data.get("torch_error")),
    )


def torch_facts_from_run(run: ScriptRun) -> TorchFacts:
    """The facts from a run of torch_bench.py facts; a run that failed gives its sentence as the reason."""
    if run.data is None or run.data.get("kind") != "facts":
        return TorchFacts.unavailable(run.failure or "torch_bench.py gave no facts", run.python)
    facts = torch_facts_from(run.data)
    if facts.torch_error is not None and run.failure:
        return replace(facts, torch_error=run.failure)  # the run's sentence names the interpreter
    return facts


def read_torch_facts(python: str | None = None, timeout_s: float = 60.0) -> TorchFacts:
    """Run torch_bench.py facts under PYTHON (default: this interpreter)."""
    from gpubox.doctor.interpreter import run_script

    return torch_facts_from_run(run_script("torch_bench.py", ["facts"], python=python, timeout_s=timeout_s))


def _text(value: Any, empty_ok: bool = False) -> str | None:
    if value is None or (value == "" and not empty_ok):
        return None
    return str(value)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
