"""The copy benchmarks, one GPU at a time: torch_bench.py in the chosen interpreter sees only that
GPU (by UUID), its host buffers sit on the GPU's NUMA node, and NVML samples the GPU's link from a
thread meanwhile, so the copies are judged against the link as it ran under load."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.doctor.model import Check, GpuFacts, LinkSample, SystemFacts
from gpubox.doctor.thresholds import Thresholds
from gpubox.doctor.torch_facts import TorchFacts
from gpubox.doctor.transfer import (
    PcieLink,
    TransferResult,
    copy_window,
    failed_transfer,
    link_under_load,
    transfer_result,
)
from gpubox.doctor.transfer_checks import transfer_checks

SCRIPT = Path(__file__).with_name("torch_bench.py")
COPY_BYTES = 256 * 1024 * 1024
REPS = {"quick": 10, "full": 30}
MATMUL_N = {"quick": 0, "full": 8192}  # --quick leaves the matmul out: it is the slowest part
TIMEOUT_S = {"quick": 120.0, "full": 300.0}  # torch's import and CUDA's start-up count too
SAMPLE_EVERY_S = 0.1


@dataclass(frozen=True)
class TransferRun:
    checks: tuple[Check, ...]
    results: tuple[TransferResult, ...]
    notes: tuple[str, ...]


class _Sampling:
    """LinkSampler.sample() every SAMPLE_EVERY_S from a thread, into `into`, until the block ends."""

    def __init__(self, sampler: Any, into: list[LinkSample]) -> None:
        self.sampler, self.into = sampler, into
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpubox-doctor-link", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            try:
                self.into.extend(self.sampler.sample())
            except Exception:  # a sample that fails is one sample fewer, not a failed benchmark
                continue

    def __enter__(self) -> _Sampling:
        if self.sampler is not None:
            self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(2.0)


def environment_for(uuid: str | None, base: dict[str, str]) -> dict[str, str]:
    """The benchmark sees only the GPU it measures, named by UUID, so NVML's index and torch's
    device 0 are the same GPU whatever the user's CUDA_VISIBLE_DEVICES says."""
    env = dict(base)
    if uuid:
        env["CUDA_VISIBLE_DEVICES"] = uuid
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def run_transfers(
    *,
    python: str,
    mode: str,
    facts: SystemFacts,
    torch: TorchFacts | None,
    t: Thresholds,
    gpus: Sequence[int],
    nvml: Any,
    view: Any,
    samples: list[LinkSample],
    env: dict[str, str],
) -> TransferRun:
    """Benchmark each GPU in `gpus` (NVML indexes); the link samples land in `samples`."""
    why_not = _why_not(facts, torch)
    by_index = {g.index: g for g in facts.gpus}
    if why_not is not None:
        named = [failed_transfer(why_not, gpu=g, gpu_name=by_index[g].name if g in by_index else None) for g in gpus]
        none = named or [failed_transfer(why_not, gpu=None)]
        return TransferRun(tuple(c for r in none for c in transfer_checks(r, t)), tuple(none), ())
    checks: list[Check] = []
    results: list[TransferResult] = []
    notes: list[str] = []
    for index in gpus:
        gpu = by_index[index]
        result, note = _one(python, mode, gpu, nvml, view, samples, env)
        if note:
            notes.append(note)
        results.append(result)
        checks += transfer_checks(result, t)
    return TransferRun(tuple(checks), tuple(results), tuple(notes))


def _why_not(facts: SystemFacts, torch: TorchFacts | None) -> str | None:
    if not facts.gpus:
        return facts.nvml_error or "no NVIDIA GPU on this box"
    if torch is None:
        return "torch was not asked for"
    if torch.torch_missing or torch.torch_version is None:
        return torch.torch_error or "torch cannot be imported by the chosen interpreter"
    if not torch.cuda_available:
        return torch.cuda_error or "torch sees no CUDA device (a CPU-only build, or no driver)"
    return None


def _one(
    python: str,
    mode: str,
    gpu: GpuFacts,
    nvml: Any,
    view: Any,
    samples: list[LinkSample],
    env: dict[str, str],
) -> tuple[TransferResult, str | None]:
    from gpubox.doctor.interpreter import run_script

    args = ["transfer", "--gpu", "0", "--reps", str(REPS[mode]), "--bytes", str(COPY_BYTES)]
    cpus, note = _numa_cpus(view, gpu)
    if cpus:
        args += ["--cpus", ",".join(map(str, sorted(cpus)))]
    if MATMUL_N[mode]:
        args += ["--matmul", str(MATMUL_N[mode])]
    sampler = _sampler(nvml, gpu.index)
    taken: list[LinkSample] = []
    try:
        with _Sampling(sampler, taken):
            run = run_script(SCRIPT, args, python=python, timeout_s=TIMEOUT_S[mode], env=environment_for(gpu.uuid, env))
    finally:
        if sampler is not None:
            sampler.close()
    if not run.ok or run.data is None:
        return failed_transfer(run.failure or "the benchmark gave no answer", gpu=gpu.index, gpu_name=gpu.name), note
    window = load_window(run.data)
    # Only what NVML saw while the copies and the matmul ran counts as "under load": torch's import and
    # CUDA's start-up leave the GPU idle, and idle clocks and links are low on purpose.
    samples.extend(s for s in taken if window is not None and window[0] <= s.at <= window[1])
    since, until = window if window else (None, None)
    link_now = link_under_load(samples, gpu.index, since, until)
    link_max = PcieLink.of(gpu.pcie_gen_max, gpu.pcie_width_max)
    return transfer_result(run.data, gpu=gpu.index, link_now=link_now, link_max=link_max, gpu_name=gpu.name), note


def load_window(data: Mapping[str, Any]) -> tuple[float, float] | None:
    """(start, end) of the timed copies and the matmul on the system's monotonic clock, or None."""
    spans = [w for w in (copy_window(data), _span(data.get("matmul"))) if w is not None]
    return (min(w[0] for w in spans), max(w[1] for w in spans)) if spans else None


def _span(entry: Any) -> tuple[float, float] | None:
    if not isinstance(entry, Mapping):
        return None
    start, end = entry.get("started_at"), entry.get("ended_at")
    return (float(start), float(end)) if isinstance(start, float) and isinstance(end, float) else None


def _numa_cpus(view: Any, gpu: GpuFacts) -> tuple[frozenset[int] | None, str | None]:
    """The CPUs of the GPU's NUMA node that this process may use, so first touch places the host
    buffers there; None (and why) where that cannot be known."""
    if view is None or gpu.pci_bus_id is None:
        return None, None
    from gpubox.doctor.host_view import gpu_numa_cpus

    try:
        numa = gpu_numa_cpus(view, gpu.pci_bus_id)
    except (OSError, ValueError) as exc:  # unreadable or garbled sysfs and cgroup files
        return None, f"GPU {gpu.index}: host buffers not placed on its NUMA node ({exc})"
    return (numa.cpus or None), None


def _sampler(nvml: Any, index: int) -> Any:
    if nvml is None:
        return None
    from gpubox.doctor.nvml_facts import LinkSampler

    try:
        return LinkSampler(nvml, gpus=[index])
    except Exception:  # no samples: the copies are judged against the link's maximum only
        return None
