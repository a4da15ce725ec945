"""CPU time per refresh of gpubox's NVML sampler against nvitop's API, on the same fake NVML.

Both read the same scenario (8 Hopper GPUs with GPM, N processes whose pids are real sleeping
processes, so host lookups cost what they cost on a real box) through the same pynvml, each in
its own subprocess, alternating. Needs `pip install nvitop` and a C compiler.

    python benchmarks/sampler_cpu.py --processes 40 --refreshes 100 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child(which: str, refreshes: int) -> None:
    """Runs in a subprocess with the fake NVML on LD_LIBRARY_PATH; prints CPU s per refresh."""
    if which == "gpubox":
        from gpubox.telemetry.nvml_backend import NvmlBackend

        backend = NvmlBackend()
        step = backend.sample
    else:
        from nvitop import Device, GpuProcess

        devices = Device.all()

        def step() -> None:
            devs = Device.all() if which == "nvitop-all" else devices
            for d in devs:
                d.as_snapshot()
            procs = [p for d in devs for p in d.processes().values()]
            GpuProcess.take_snapshots(procs, failsafe=True)

    for _ in range(3):  # warm caches and rate baselines on both sides
        step()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(refreshes):
        step()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"cpu_per_refresh": cpu / refreshes, "wall_per_refresh": wall / refreshes}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=40)
    ap.add_argument("--refreshes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", choices=["gpubox", "nvitop", "nvitop-all"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.refreshes)
        return 0

    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.scenarios import hopper8, with_pids

    libdir = build_fake_nvml("full")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(args.processes)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            scenario = Path(tmp) / "scenario.txt"
            with_pids(hopper8(processes=args.processes), [p.pid for p in sleepers]).write(scenario)
            env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), FAKE_NVML_SCENARIO=str(scenario))
            results: dict[str, list[float]] = {"gpubox": [], "nvitop": [], "nvitop-all": []}
            for _ in range(args.rounds):
                for which in results:
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", which, "--refreshes", str(args.refreshes)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    results[which].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_per_refresh"])
    finally:
        for p in sleepers:
            p.kill()
            p.wait()

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"8 GPUs, {args.processes} processes, {args.refreshes} refreshes x {args.rounds} rounds (median)")
    print(f"{'sampler':<34}{'CPU ms/refresh':>16}{'vs gpubox':>12}")
    labels = {
        "gpubox": "gpubox NvmlBackend.sample()",
        "nvitop": "nvitop (devices kept)",
        "nvitop-all": "nvitop (Device.all() each refresh)",
    }
    for key, label in labels.items():
        print(f"{label:<34}{med[key] * 1000:>16.2f}{med[key] / med['gpubox']:>11.1f}x")
    ok = med["gpubox"] < 0.5 * med["nvitop"]
    print(f"goal: gpubox < half of nvitop's CPU per refresh: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
