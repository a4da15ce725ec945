"""Checks loader_wait against a real CUDA training loop (run through scripts/gpu-check.sh).

The same small model trains twice on GPU 0 under `gpubox run`: once fed by a deliberately slow
DataLoader (each sample sleeps), once by a fast one. While each runs, `gpubox top --once --json`
must show the slow one starving (high loader_wait, low SM activity) and the fast one fed (low
loader_wait, high SM activity). Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

TRAIN = r"""
import sys, time, torch
from torch.utils.data import DataLoader, Dataset

sleep_s, seconds = float(sys.argv[1]), float(sys.argv[2])

class Data(Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        if sleep_s:
            time.sleep(sleep_s)
        return torch.randn(1024)

model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda().half()
loader = DataLoader(Data(), batch_size=64, num_workers=2, pin_memory=True)
end = time.time() + seconds
for batch in loader:
    x = batch.cuda(non_blocking=True).half().repeat(1, 4).repeat(8, 1)
    for _ in range(20):
        x = model(x)
    torch.cuda.synchronize()
    if time.time() > end:
        break
"""


def top_once(pid: int) -> tuple[dict, dict | None]:
    out = subprocess.run(
        [sys.executable, "-m", "gpubox", "top", "--once", "--json", "--gpu", "0", "--interval", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(out.stdout)["data"]
    proc = next((p for p in data["processes"] if p["pid"] == pid), None)
    return data["gpus"][0], proc


def run_case(sleep_s: float) -> tuple[dict, dict | None]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    job = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "run", sys.executable, "-c", TRAIN, str(sleep_s), "40"], env=env
    )
    try:
        time.sleep(20)  # CUDA start-up, worker start-up, and a full loader_wait window
        return top_once(job.pid)
    finally:
        job.terminate()
        job.wait(timeout=60)


def main() -> int:
    checks: list[tuple[str, bool, str]] = []
    gpu, proc = run_case(0.01)  # 64 samples x 10 ms / 2 workers: about 0.3 s per batch
    wait = proc and proc["loader_wait"]
    active = gpu["sm_active"] if gpu["sm_active"] is not None else gpu["gpu_busy"]
    print(f"slow loader: loader_wait={wait} source={proc and proc['loader_wait_source']} sm/busy={active}")
    checks.append(("slow loader: loader_wait > 0.6 from the probe", bool(wait and wait > 0.6), str(wait)))
    checks.append(("slow loader: SM activity < 40%", active is not None and active < 40, str(active)))
    gpu, proc = run_case(0.0)
    wait = proc and proc["loader_wait"]
    active = gpu["sm_active"] if gpu["sm_active"] is not None else gpu["gpu_busy"]
    print(f"fast loader: loader_wait={wait} source={proc and proc['loader_wait_source']} sm/busy={active}")
    checks.append(("fast loader: loader_wait < 0.2", wait is not None and wait < 0.2, str(wait)))
    checks.append(("fast loader: SM activity > 50%", active is not None and active > 50, str(active)))
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
