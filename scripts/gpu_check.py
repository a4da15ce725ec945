"""Checks `gpubox top --once --json` against real load on a machine with an NVIDIA GPU.

Run through scripts/gpu-check.sh. It starts a torch matmul loop and a pinned host-to-device
copy loop on GPU 0, reads one snapshot over a 2 s window, and checks that the figures gpubox
reports are non-zero and plausible. Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

MATMUL = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""

H2D = """
import time, torch
host = torch.empty(256 * 1024 * 1024, dtype=torch.uint8).pin_memory()
dev = torch.empty_like(host, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
"""


def snapshot(window: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "gpubox", "top", "--once", "--json", "--gpu", "0", "--interval", str(window)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise SystemExit(f"gpubox top --once --json failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)["data"]


def main() -> int:
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str) -> None:
        results.append((name, ok, detail))

    t0 = time.time()
    idle = snapshot(1.0)
    gpu = idle["gpus"][0]
    print(f"GPU 0: {gpu['name']}  driver {idle['host']['driver_version']}  CUDA {idle['host']['cuda_driver_version']}")
    print(f"idle:  busy={gpu['gpu_busy']} sm_active={gpu['sm_active']}", end=" ")
    print(f"pcie_rx={gpu['pcie_rx_Bps']} ({gpu['pcie_source']})")
    has_gpm = "sm_active" not in gpu["reasons"] or gpu["reasons"]["sm_active"] == "warming_up"

    duration = 25
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    loads = [
        subprocess.Popen([sys.executable, "-c", MATMUL, str(duration)], env=env),
        subprocess.Popen([sys.executable, "-c", H2D, str(duration)], env=env),
    ]
    try:
        time.sleep(8)  # CUDA context creation and the first kernels
        busy = snapshot(2.0)
    finally:
        for p in loads:
            p.wait(timeout=duration + 60)
    g = busy["gpus"][0]
    print(
        f"load:  busy={g['gpu_busy']} sm_active={g['sm_active']} sm_occupancy={g['sm_occupancy']} "
        f"pcie_rx={g['pcie_rx_Bps']} pcie_tx={g['pcie_tx_Bps']} ({g['pcie_source']}) "
        f"link=Gen{g['pcie_link_gen']}x{g['pcie_link_width']} power={g['power_w']}W"
    )
    check("gpu_busy > 20%", (g["gpu_busy"] or 0) > 20, str(g["gpu_busy"]))
    if has_gpm:
        check("sm_active > 20% (GPM)", (g["sm_active"] or 0) > 20, str(g["sm_active"]))
        check("0 < sm_occupancy <= 100 (GPM)", 0 < (g["sm_occupancy"] or 0) <= 100, str(g["sm_occupancy"]))
    else:
        check("sm_active null with a reason (no GPM)", g["sm_active"] is None and "sm_active" in g["reasons"], "")
    check("pcie_rx_Bps > 1 GB/s during the copy loop", (g["pcie_rx_Bps"] or 0) > 1e9, str(g["pcie_rx_Bps"]))
    pids = {p.pid for p in loads}
    ours = [p for p in busy["processes"] if p["pid"] in pids]
    check("both load processes listed", len(ours) == 2, str([p["pid"] for p in ours]))
    best = max((p["sm_util"] or 0 for p in ours), default=0)
    check("the matmul process's sm_util > 0", best > 0, str([p["sm_util"] for p in ours]))
    check("per-process GPU memory > 0", all((p["gpu_mem_bytes"] or 0) > 0 for p in ours), "")
    check("command lines resolved", all("python" in (p["command"] or "") for p in ours), "")

    print()
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
    print(f"{sum(ok for _, ok, _ in results)}/{len(results)} checks passed in {time.time() - t0:.0f} s")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
