"""Choosing a backend, and taking one snapshot whose rates cover a known window."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from gpubox.digits import ascii_int
from gpubox.telemetry.backend import TelemetryBackend
from gpubox.telemetry.model import BoxSnapshot, GpuId, GpuSnapshot


def open_backend(
    demo: bool,
    demo_gpus: int = 4,
    demo_processes: int = 12,
    loader_window: int = 10,
    loader_sampling: bool = True,
) -> TelemetryBackend:
    """The simulated box, or NVML (raises BackendUnavailable when there is no driver).
    `loader_window` is the seconds loader wait is averaged over; `loader_sampling` allows
    sampling the stacks of GPU processes that run no probe."""
    if demo:
        from gpubox.telemetry.simulated import SimulatedBackend

        return SimulatedBackend(gpus=demo_gpus, processes=demo_processes)
    from gpubox.telemetry.loader_wait import LoaderWaitReader
    from gpubox.telemetry.nvml_backend import NvmlBackend

    return NvmlBackend(loader_wait=LoaderWaitReader(window_s=loader_window, sampling=loader_sampling))


def snapshot_over(backend: TelemetryBackend, window: float, sleep: Callable[[float], None] = time.sleep) -> BoxSnapshot:
    """One snapshot whose rates (GPM, PCIe, CPU %) are averaged over `window` seconds: a
    one-shot reader has no previous refresh, so it takes one and waits."""
    backend.sample()
    sleep(window)
    return backend.sample()


def parse_gpu_selection(text: str, gpus: Iterable[GpuId | GpuSnapshot]) -> frozenset[str]:
    """'0,2' or UUIDs (or unique UUID prefixes) of these GPUs to the UUIDs of what they name; an
    index or a GPU's UUID names the card with its MIG instances, a MIG UUID that instance alone.
    ValueError names the bad one."""
    gpus = tuple(gpus)
    chosen: set[str] = set()
    indices = sorted({g.index for g in gpus})
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        index = ascii_int(part)
        if index is not None:
            if index not in indices:
                have = ", ".join(map(str, indices)) or "none"
                raise ValueError(f"no GPU {part} on this box (GPUs: {have})")
            chosen |= {g.uuid for g in gpus if g.index == index}
            continue
        matches = [g for g in gpus if g.uuid.lower().startswith(part.lower())]
        if len(matches) != 1:
            raise ValueError(f"{part!r} names {'no' if not matches else 'more than one'} GPU")
        (named,) = matches
        if named.uuid.upper().startswith("MIG-"):
            chosen.add(named.uuid)
        else:
            chosen |= {g.uuid for g in gpus if g.index == named.index}
    if not chosen:
        raise ValueError("--gpu needs GPU indices or UUIDs, like --gpu 0,2")
    return frozenset(chosen)
