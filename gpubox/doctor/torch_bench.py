"""Facts and benchmarks from torch, run as a script in the interpreter of the user's training
environment (`gpubox doctor --python PATH`), which may not have gpubox installed: so only the
standard library here, torch is imported inside the functions that use it, and the code keeps to
Python 3.8 (torch 2.x's oldest) at run time.

    PYTHON torch_bench.py facts
    PYTHON torch_bench.py transfer --gpu 0 --cpus 0-15 --reps 10 --bytes 268435456 [--matmul 8192]

Each prints one JSON object on stdout with raw timings (seconds per repetition), never verdicts:
gpubox.doctor.transfer and gpubox.doctor.library_checks judge them. Without CUDA the answer says
why in "error"; exit code 0 whenever an answer was printed, 1 for an unexpected error (still
answered), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

SCHEMA = 1
DEFAULT_BYTES = 256 * 1024 * 1024
DEFAULT_REPS = 10
COPY_WARMUP = 2  # untimed copies first: they pay for lazy mapping and wake the link from its idle speed
MATMUL_WARMUP_S = 0.5  # clocks ramp up from idle and cuBLAS picks its kernel before the timed runs
MATMULS_PER_REP = 10  # one matmul is ~1 ms on a large GPU: time ten per repetition


def cpu_list(text: str) -> list[int]:
    """CPUs in the kernel's list form ("0-15,32-47") as a sorted list; ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        low, dash, high = part.partition("-")
        first, last = int(low), int(high) if dash else int(low)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError("no CPUs listed")
    return sorted(cpus)


def facts() -> dict[str, Any]:
    """What torch is in this environment and which GPUs it can use."""
    answer: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "facts",
        "python": sys.executable,
        "python_version": platform.python_version(),
        "torch_version": None,
        "torch_missing": False,
        "torch_error": None,
        "cuda_build": None,
        "hip_build": None,
        "cuda_available": False,
        "cuda_error": None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": 0,
        "arch_list": [],
        "devices": [],
        "error": None,
    }
    torch = _import_torch(answer)
    if torch is None:
        return answer
    answer["arch_list"] = _arch_list(torch)
    answer["cuda_error"] = _cuda_error(torch)
    answer["cuda_available"] = answer["cuda_error"] is None
    if answer["cuda_available"]:
        answer["device_count"] = int(torch.cuda.device_count())
        answer["devices"] = [_device(torch, i) for i in range(answer["device_count"])]
    return answer


def transfer(gpu: int, cpus: list[int] | None, reps: int, nbytes: int, matmul_n: int) -> dict[str, Any]:
    """Copies between host and GPU (pageable and pinned, both ways), a device-to-device copy and,
    when matmul_n > 0, a bf16 matmul: seconds per repetition for each."""
    answer: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "transfer",
        "python": sys.executable,
        "torch_version": None,
        "torch_missing": False,
        "torch_error": None,
        "cuda_build": None,
        "error": None,
        "device": None,
        "affinity": _run_on(cpus),  # before torch loads, so every thread it starts inherits the CPUs
        "reps": reps,
        "warmup": COPY_WARMUP,
        "bytes": nbytes,
        "copies": {},
        "matmul": None,
    }
    torch = _import_torch(answer)
    if torch is None:
        if answer["torch_missing"]:
            answer["error"] = "torch is not installed in this environment"
        else:
            answer["error"] = f"torch is installed but cannot be imported: {answer['torch_error']}"
        return answer
    why = _cuda_error(torch)
    if why is not None:
        answer["error"] = f"CUDA is not available to torch {answer['torch_version']}: {why}"
        return answer
    count = int(torch.cuda.device_count())
    if not 0 <= gpu < count:
        answer["error"] = f"torch sees {count} GPU(s) here, so there is no GPU {gpu}"
        return answer
    torch.cuda.set_device(gpu)
    answer["device"] = _device(torch, gpu)
    try:
        answer["copies"] = _copies(torch, gpu, reps, nbytes)
    except Exception as exc:  # the buffers themselves did not fit: nothing to time
        answer["error"] = f"could not set up the copies on GPU {gpu}: {_reason(exc)}"
        return answer
    if matmul_n > 0:
        answer["matmul"] = _guarded(lambda: _matmul(torch, gpu, reps, matmul_n))
    return answer


def _import_torch(answer: dict[str, Any]) -> Any:
    """torch, or None with the reason written into answer."""
    try:
        import torch
    except Exception as exc:  # a broken install raises anything from OSError to AttributeError
        # only torch itself not found is "not installed": a ModuleNotFoundError from inside is breakage
        answer["torch_missing"] = isinstance(exc, ModuleNotFoundError) and exc.name == "torch"
        answer["torch_error"] = _reason(exc)
        return None
    answer["torch_version"] = str(torch.__version__)
    answer["cuda_build"] = torch.version.cuda
    if "hip_build" in answer:
        answer["hip_build"] = getattr(torch.version, "hip", None)
    return torch


def _cuda_error(torch: Any) -> str | None:
    """None when CUDA works, else why not: init raises the reason that is_available() hides."""
    if torch.version.cuda is None:
        hip = getattr(torch.version, "hip", None)
        return f"it is a ROCm build (HIP {hip})" if hip else "it is a CPU-only build (torch.version.cuda is None)"
    if torch.cuda.is_available():
        return None
    try:
        torch.cuda.init()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return "torch.cuda.is_available() is False"


def _arch_list(torch: Any) -> list[str]:
    """The GPU code torch was built with (sm_XY binaries, compute_XY PTX). get_arch_list() is
    empty while CUDA is unusable, so fall back to the build's own flags."""
    try:
        arches = [str(a) for a in torch.cuda.get_arch_list()]
    except Exception:
        arches = []
    if not arches and torch.version.cuda is not None:
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        try:
            text = flags() if callable(flags) else None
        except Exception:
            text = None
        arches = str(text).split() if text else []
    return arches


def _device(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    uuid_text = str(uuid) if uuid is not None else None
    if uuid_text and not uuid_text.startswith(("GPU-", "MIG-")):
        uuid_text = f"GPU-{uuid_text}"  # NVML's spelling, so the doctor can match the two
    bus = getattr(props, "pci_bus_id", None)
    domain = getattr(props, "pci_domain_id", None)
    slot = getattr(props, "pci_device_id", None)
    numbered = all(isinstance(n, int) for n in (domain, bus, slot))  # torch 2.5 and later
    bus_id = f"{domain:04x}:{bus:02x}:{slot:02x}.0" if numbered else None  # sysfs form, as NVML's facts
    major, minor = torch.cuda.get_device_capability(index)
    return {
        "index": index,
        "name": str(props.name),
        "capability": [int(major), int(minor)],
        "memory_total_bytes": int(props.total_memory),
        "multiprocessors": int(props.multi_processor_count),
        "uuid": uuid_text,
        "pci_bus_id": bus_id,
    }


def _run_on(cpus: list[int] | None) -> dict[str, Any]:
    """Run on the GPU's NUMA node CPUs, so host buffers touched from here are placed on that node."""
    affinity: dict[str, Any] = {"requested": cpus, "cpus": None, "applied": False, "error": None}
    if cpus is None:
        return affinity
    if not hasattr(os, "sched_setaffinity"):
        affinity["error"] = "CPU affinity cannot be set on this platform"
        return affinity
    try:
        os.sched_setaffinity(0, cpus)
        affinity["applied"] = True
    except OSError as exc:
        affinity["error"] = f"sched_setaffinity: {exc.strerror or exc}"
    affinity["cpus"] = sorted(os.sched_getaffinity(0))
    return affinity


def _copies(torch: Any, gpu: int, reps: int, nbytes: int) -> dict[str, Any]:
    device = torch.device("cuda", gpu)
    on_gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    on_gpu_2 = torch.empty(nbytes, dtype=torch.uint8, device=device)
    on_gpu.fill_(1)
    # fill_ touches every page from this process's CPUs: first touch places them on that node
    pageable = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    copies: dict[str, Any] = {}
    # pageable copies go through the driver's staging buffer on the CPU, which events on the
    # GPU's stream would not see: wall time around a synchronized copy
    copies["h2d_pageable"] = _guarded(lambda: _wall(torch, lambda: on_gpu.copy_(pageable), reps, nbytes))
    copies["d2h_pageable"] = _guarded(lambda: _wall(torch, lambda: pageable.copy_(on_gpu), reps, nbytes))
    pinned: Any = None
    try:
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(1)
    except Exception as exc:
        failed = {
            "bytes": nbytes,
            "seconds": [],
            "timer": None,
            "started_at": None,
            "ended_at": None,
            "error": _reason(exc),
        }
        copies["h2d_pinned"] = copies["d2h_pinned"] = failed
    if pinned is not None:
        copies["h2d_pinned"] = _guarded(
            lambda: _copy_events(torch, lambda: on_gpu.copy_(pinned, non_blocking=True), reps, nbytes)
        )
        copies["d2h_pinned"] = _guarded(
            lambda: _copy_events(torch, lambda: pinned.copy_(on_gpu, non_blocking=True), reps, nbytes)
        )
    copies["d2d"] = _guarded(lambda: _copy_events(torch, lambda: on_gpu_2.copy_(on_gpu), reps, nbytes))
    return copies


def _wall(torch: Any, copy: Callable[[], Any], reps: int, nbytes: int) -> dict[str, Any]:
    for _ in range(COPY_WARMUP):
        copy()
    torch.cuda.synchronize()
    started = time.monotonic()
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    return _timed(seconds, "wall", started, bytes=nbytes)


def _events(torch: Any, op: Callable[[], Any], reps: int) -> list[float]:
    """Seconds of each op by CUDA events on the current stream: the GPU's own clock, no host overhead."""
    pairs = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        op()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [float(start.elapsed_time(end)) / 1000.0 for start, end in pairs]  # elapsed_time is in ms


def _copy_events(torch: Any, copy: Callable[[], Any], reps: int, nbytes: int) -> dict[str, Any]:
    for _ in range(COPY_WARMUP):
        copy()
    torch.cuda.synchronize()
    started = time.monotonic()
    return _timed(_events(torch, copy, reps), "cuda_event", started, bytes=nbytes)


def _matmul(torch: Any, gpu: int, reps: int, n: int) -> dict[str, Any]:
    device = torch.device("cuda", gpu)
    major, _ = torch.cuda.get_device_capability(gpu)
    # bf16 tensor cores from Ampere (8.x) on; is_bf16_supported() also says yes for emulated bf16
    dtype = torch.bfloat16 if major >= 8 else torch.float16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def batch() -> None:
        for _ in range(MATMULS_PER_REP):
            torch.matmul(a, b, out=c)

    deadline = time.perf_counter() + MATMUL_WARMUP_S
    while time.perf_counter() < deadline:
        batch()
        torch.cuda.synchronize()
    started = time.monotonic()
    seconds = _events(torch, batch, reps)
    return _timed(
        seconds,
        "cuda_event",
        started,
        n=n,
        dtype=str(dtype).replace("torch.", ""),
        matmuls_per_rep=MATMULS_PER_REP,
        flops=2 * n**3 * MATMULS_PER_REP,  # per repetition
    )


def _timed(seconds: list[float], timer: str, started: float, **what: Any) -> dict[str, Any]:
    # monotonic is one clock for the whole system on Linux: the doctor matches its link samples to it
    return {
        **what,
        "seconds": seconds,
        "timer": timer,
        "started_at": started,
        "ended_at": time.monotonic(),
        "error": None,
    }


def _guarded(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One measurement; its failure (out of memory, a CUDA error) is its answer, not the run's end."""
    try:
        return measure()
    except Exception as exc:
        return {"seconds": [], "timer": None, "started_at": None, "ended_at": None, "error": _reason(exc)}


def _reason(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message, as in
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB ...". torch's CUDA errors
    go on for lines of advice after the words that matter. (loader_bench.error_line's twin: each
    script runs alone, without gpubox.)"""
    kind = type(exc)
    name = (
        kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    )
    lines = str(exc).splitlines()
    # a message that carries a traceback: the first line after its last traceback's frames names the cause
    heads = [i for i, line in enumerate(lines) if line.rstrip().endswith("Traceback (most recent call last):")]
    if heads:
        for line in lines[heads[-1] + 1 :]:
            if line.strip() and not line[0].isspace():
                return line.strip()
    first = next((line.strip() for line in lines if line.strip()), "")
    return f"{name}: {first}" if first else name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torch_bench.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("facts", help="torch's version, CUDA build, architectures and GPUs")
    bench = commands.add_parser("transfer", help="time copies to and from one GPU, and a matmul")
    bench.add_argument("--gpu", type=int, default=0, help="torch's device index")
    bench.add_argument("--cpus", type=cpu_list, default=None, help="run on these CPUs, as 0-15,32-47")
    bench.add_argument("--reps", type=_positive, default=DEFAULT_REPS, help="timed repetitions of each")
    bench.add_argument("--bytes", type=_positive, default=DEFAULT_BYTES, help="bytes per copy")
    bench.add_argument("--matmul", type=int, default=0, metavar="N", help="also an NxN bf16 matmul (0: none)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "facts":
            answer = facts()
        else:
            answer = transfer(args.gpu, args.cpus, args.reps, args.bytes, args.matmul)
    except Exception as exc:
        traceback.print_exc()
        print(json.dumps({"schema": SCHEMA, "kind": args.command, "error": _reason(exc)}))
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    # the script's own folder holds gpubox's modules (model.py, transfer.py, ...): keep them from
    # shadowing what torch imports
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    sys.exit(main())
