"""Checks `gpubox doctor` on a machine with an NVIDIA GPU.

Run through scripts/gpu-check.sh. `gpubox doctor --json` (--quick) must take under 30 s.
`gpubox doctor --json --full` must run its copy benchmarks on GPU 0; its pinned host-to-device
and device-to-host figures must agree within 10% with a plain loop of CUDA-event-timed copies
in torch, run here; pinned must beat pageable; the link must be seen under load. `gpubox
doctor loader` on the example must run on the GPU, copy batches there and find the example
input-bound. Prints what it measured; exit 0 when every check passes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

NBYTES = 256 * 1024 * 1024
REPS = 30


def plain_copies() -> dict[str, float]:
    """GB/s of pinned copies both ways on GPU 0: the simplest loop that measures them."""
    import torch

    on_gpu = torch.empty(NBYTES, dtype=torch.uint8, device="cuda:0")
    pinned = torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True).fill_(1)
    out = {}
    for name, copy in (
        ("h2d_pinned", lambda: on_gpu.copy_(pinned, non_blocking=True)),
        ("d2h_pinned", lambda: pinned.copy_(on_gpu, non_blocking=True)),
    ):
        for _ in range(3):
            copy()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        out[name] = NBYTES / statistics.median(times) / 1e9
    return out


def gpubox(*args: str, timeout: float = 240) -> tuple[int, dict[str, Any]]:
    res = subprocess.run([sys.executable, "-m", "gpubox", *args], capture_output=True, text=True, timeout=timeout)
    if res.stderr.strip():
        print(res.stderr.strip()[-2000:])
    return res.returncode, json.loads(res.stdout)


def main() -> int:
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    started = time.monotonic()
    code, doc = gpubox("doctor", "--json")
    took = time.monotonic() - started
    print(f"doctor --quick exit {code} in {took:.1f} s: {doc['data']['summary'] if doc['data'] else doc['errors']}")
    expect(took < 30, f"doctor --quick takes under 30 s on a GPU box ({took:.1f} s)")

    code, doc = gpubox("doctor", "--json", "--full", "--gpu", "0")
    data = doc["data"]
    if data is None:
        expect(False, f"doctor --full gave a report ({doc['errors']})")
        return 1
    print(f"doctor exit {code}: {data['summary']}")
    for finding in data["findings"]:
        print(f"  {finding['status']:4} {finding['id']} gpu={finding['gpu']}: {finding['detail']}")
    [result] = [r for r in data["benchmarks"]["transfer"] if r["gpu"] == 0]
    expect(result["error"] is None, f"the benchmark ran on GPU 0 ({result['error']})")
    if result["affinity_cpus"]:  # the same NUMA node as the doctor's buffers, or 10% means nothing
        os.sched_setaffinity(0, result["affinity_cpus"])
    plain = plain_copies()
    for name in ("h2d_pinned", "d2h_pinned"):
        ours = result[name]["gb_per_s"] or 0.0
        theirs = plain[name]
        print(f"  {name}: doctor {ours:.2f} GB/s, plain torch loop {theirs:.2f} GB/s")
        expect(abs(ours - theirs) <= 0.10 * theirs, f"{name} within 10% of a plain CUDA-event loop")
        pageable = result[name.replace("pinned", "pageable")]["gb_per_s"] or 0.0
        expect(ours > pageable, f"{name} ({ours:.1f} GB/s) faster than pageable ({pageable:.1f} GB/s)")
    link = result["link_now"]
    expect(link is not None, f"the link was seen under load ({link})")
    d2d, matmul = result["d2d"], result["matmul"]
    print(f"  d2d traffic {d2d['traffic_gb_per_s']} GB/s; matmul {matmul['tflops']} TFLOPS ({matmul['dtype']})")
    memory, peak = d2d["memory_fraction"] or 0.0, matmul["peak_fraction"] or 0.0
    expect(0.5 <= memory <= 1.05, f"device copies reach 50-105% of the datasheet memory bandwidth ({memory:.0%})")
    expect(0.4 <= peak <= 1.05, f"the bf16 matmul reaches 40-105% of the datasheet peak ({peak:.0%})")

    code, doc = gpubox(
        "doctor", "loader", "examples/doctor/slow_loader.py:make", "--json", "--device", "cuda:0", timeout=180
    )
    if doc["data"] is None:
        expect(False, f"doctor loader gave a report ({doc['errors']})")
        return 1
    facts = doc["data"]["facts"]
    print(f"doctor loader exit {code}: {doc['data']['summary']}")
    device = str(facts.get("device", {}).get("name"))
    expect(device.startswith("cuda"), f"the loader benchmark ran on the GPU ({device})")
    rows = doc["data"]["benchmarks"].get("loader") or []
    expect(any(r.get("copy_per_s") for r in rows), "batches were copied to the GPU")
    expect(bool(facts.get("verdict", {}).get("input_bound")), "the slow example is found input-bound")

    print("doctor gpu-check: " + ("all passed" if not failures else f"{len(failures)} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
