"""The "host.environment" check: environment variables that slow CUDA down or hide GPUs from it.
Only variables whose effect is documented (CUDA Programming Guide, PyTorch, NCCL) are judged."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpubox.digits import ascii_int
from gpubox.doctor.host_view import HostView, UsableCpus
from gpubox.doctor.model import Check, GpuFacts, Status, SystemFacts

_RANK: dict[Status, int] = {"ok": 0, "skip": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class EnvFinding:
    name: str
    value: str
    status: Status
    impact: float
    what: str  # one sentence: what the setting does to the job
    fix: str


@dataclass(frozen=True)
class _Context:
    gpus: tuple[GpuFacts, ...]
    nvml_ok: bool  # the GPU list is known, so CUDA_VISIBLE_DEVICES can be checked against it
    cpus: float | None


def _launch_blocking(value: str, _: _Context) -> EnvFinding | None:
    if value.strip() != "1":
        return None
    what = "every kernel launch waits for the kernel to finish, so the CPU never runs ahead of the GPU (a debug aid)"
    return EnvFinding("CUDA_LAUNCH_BLOCKING", value, "warn", 0.5, what, "unset CUDA_LAUNCH_BLOCKING")


def _no_caching(value: str, _: _Context) -> EnvFinding | None:
    if value.strip() in {"", "0"}:
        return None
    what = "PyTorch's caching allocator is off: every tensor calls cudaMalloc and cudaFree, which synchronize the GPU"
    return EnvFinding(
        "PYTORCH_NO_CUDA_MEMORY_CACHING", value, "warn", 0.4, what, "unset PYTORCH_NO_CUDA_MEMORY_CACHING"
    )


def _names_gpu(entry: str, gpus: Sequence[GpuFacts]) -> bool:
    index = ascii_int(entry)  # CUDA reads ASCII digits alone
    if index is not None:
        return index < len(gpus)
    if entry.upper().startswith("MIG-"):
        return True  # MIG instances are not in the facts: take it as valid
    # CUDA takes a UUID or a prefix of one, with its "GPU-"
    return entry.upper().startswith("GPU-") and any(g.uuid.lower().startswith(entry.lower()) for g in gpus)


def _visible_devices(value: str, ctx: _Context) -> EnvFinding | None:
    if not ctx.nvml_ok or not ctx.gpus:
        return None  # not a GPU box, or its GPUs are unknown: nothing to hold the list against
    name, n = "CUDA_VISIBLE_DEVICES", len(ctx.gpus)
    fix = f"unset CUDA_VISIBLE_DEVICES, or list GPUs that exist: indexes 0-{n - 1} or UUIDs from `nvidia-smi -L`"
    entries = [e.strip() for e in value.split(",")]
    visible = 0
    while visible < len(entries) and _names_gpu(entries[visible], ctx.gpus):
        visible += 1
    if not value.strip():
        return EnvFinding(name, value, "fail", 1.0, "it is set but empty, so CUDA sees no GPU at all", fix)
    if visible == 0:
        what = f"{entries[0]!r} names no GPU of this box ({n} GPUs), so CUDA sees none"
        return EnvFinding(name, value, "fail", 1.0, what, fix)
    if visible < len(entries):
        what = f"{entries[visible]!r} names no GPU of this box, and CUDA ignores it and every entry after it"
        return EnvFinding(name, value, "warn", 0.3, what, fix)
    return None


def _cache_disable(value: str, _: _Context) -> EnvFinding | None:
    if value.strip() != "1":
        return None
    what = "the CUDA JIT cache is off: kernels shipped as PTX are compiled again at every start"
    return EnvFinding("CUDA_CACHE_DISABLE", value, "warn", 0.05, what, "unset CUDA_CACHE_DISABLE")


def _nccl_p2p(value: str, ctx: _Context) -> EnvFinding | None:
    if value.strip() != "1" or len(ctx.gpus) < 2:
        return None
    what = (
        "NCCL does not copy GPU to GPU over NVLink or PCIe peer-to-peer but through host memory; sometimes "
        "set to work around hangs where P2P is broken (IOMMU or ACS on), so test without it"
    )
    return EnvFinding("NCCL_P2P_DISABLE", value, "warn", 0.4, what, "unset NCCL_P2P_DISABLE")


def _nccl_shm(value: str, ctx: _Context) -> EnvFinding | None:
    if value.strip() != "1" or len(ctx.gpus) < 2:
        return None
    what = (
        "NCCL may not use shared host memory between processes; where P2P is unavailable it falls back to the network"
    )
    return EnvFinding("NCCL_SHM_DISABLE", value, "warn", 0.3, what, "unset NCCL_SHM_DISABLE")


def _cudnn_v7(value: str, _: _Context) -> EnvFinding | None:
    if value.strip() != "1":
        return None
    what = "PyTorch runs convolutions through cuDNN's older v7 API, without the v8 engines and heuristics"
    return EnvFinding("TORCH_CUDNN_V8_API_DISABLED", value, "warn", 0.1, what, "unset TORCH_CUDNN_V8_API_DISABLED")


def _omp_threads(value: str, ctx: _Context) -> EnvFinding | None:
    threads = ascii_int(value.strip())
    if threads is None or ctx.cpus is None:
        return None
    cpus = max(1, math.ceil(ctx.cpus))
    if threads <= 2 * cpus:
        return None
    per_process = max(1, math.floor(ctx.cpus / max(1, len(ctx.gpus))))
    what = (
        f"the training process (and numpy, BLAS or OpenCV in loader workers) starts {int(value)} threads "
        f"on {ctx.cpus:g} usable CPUs: they preempt each other"
    )
    return EnvFinding("OMP_NUM_THREADS", value, "warn", 0.2, what, f"export OMP_NUM_THREADS={per_process}")


def _max_connections(value: str, _: _Context) -> EnvFinding | None:
    if value.strip() != "1":
        return None
    what = (
        "one hardware queue from the host to each GPU (default 8): work on different streams queues behind "
        "each other, so copies stop overlapping compute; Megatron-LM and NeMo set it on purpose"
    )
    fix = "unset CUDA_DEVICE_MAX_CONNECTIONS unless Megatron-style overlap needs it"
    return EnvFinding("CUDA_DEVICE_MAX_CONNECTIONS", value, "warn", 0.05, what, fix)


def _eager_loading(value: str, _: _Context) -> EnvFinding | None:
    if value.strip().upper() != "EAGER":
        return None
    what = "every kernel of every CUDA library loads at start-up instead of on first use: slower start, more GPU memory"
    return EnvFinding(
        "CUDA_MODULE_LOADING", value, "warn", 0.05, what, "unset CUDA_MODULE_LOADING (lazy is the default)"
    )


RULES: dict[str, Callable[[str, _Context], EnvFinding | None]] = {
    "CUDA_LAUNCH_BLOCKING": _launch_blocking,
    "PYTORCH_NO_CUDA_MEMORY_CACHING": _no_caching,
    "CUDA_VISIBLE_DEVICES": _visible_devices,
    "CUDA_CACHE_DISABLE": _cache_disable,
    "NCCL_P2P_DISABLE": _nccl_p2p,
    "NCCL_SHM_DISABLE": _nccl_shm,
    "TORCH_CUDNN_V8_API_DISABLED": _cudnn_v7,
    "OMP_NUM_THREADS": _omp_threads,
    "CUDA_DEVICE_MAX_CONNECTIONS": _max_connections,
    "CUDA_MODULE_LOADING": _eager_loading,
}


def environment_findings(view: HostView, facts: SystemFacts, cpus: UsableCpus) -> list[EnvFinding]:
    ctx = _Context(facts.gpus, facts.nvml_error is None, cpus.count)
    found = (rule(view.environ[name], ctx) for name, rule in RULES.items() if name in view.environ)
    return [f for f in found if f is not None]


def environment_check(view: HostView, facts: SystemFacts, cpus: UsableCpus) -> Check:
    id, title = "host.environment", "CUDA environment variables"
    found = environment_findings(view, facts, cpus)
    evidence = {f.name: {"value": f.value, "status": f.status, "impact": f.impact} for f in found}
    if not found:
        detail = f"none of the {len(RULES)} variables known to slow CUDA or hide GPUs is set to do so"
        meaning = "Checked in the environment gpubox runs in, which jobs started from this shell inherit."
        return Check(id, title, "host", "ok", detail, {}, None, meaning, evidence=evidence)
    found.sort(key=lambda f: (-_RANK[f.status], -f.impact))
    status = found[0].status
    detail = ", ".join(f"{f.name}={f.value!r}" for f in found)
    meaning = " ".join(f"{f.name}: {f.what}." for f in found) + " Jobs started from this shell inherit them."
    fix = "; ".join(f.fix for f in found)
    value = {f.name: f.value for f in found}
    return Check(id, title, "host", status, detail, value, None, meaning, fix, None, found[0].impact, evidence)
