"""End to end: a real torch DataLoader on the CPU, timed by the probe in the training process,
read from another process by `gpubox top --once --json` while the job runs.

The dataset's __getitem__ sleeps a known time and each training step busy-waits a known time,
so the share of wall time spent waiting for batches is known in advance:

- num_workers=0: the loop loads, then steps: wait = load / (load + step) = 30 / (30 + 20) = 60%.
- num_workers=2: two workers load in parallel, each taking 20 ms a batch, so a batch is ready
  every 10 ms; a 5 ms step then waits 5 ms for each next batch: wait = 5 / 10 = 50%.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import run_gpubox

pytest.importorskip("torch")
pytest.importorskip("gpubox.probe.hook")  # the probe's DataLoader hook

WINDOW_S = 10  # the default top.loader_window
TOLERANCE = 0.05

TRAIN = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exit cleanly: workers stopped, file removed
if sys.argv[4] == "install":
    import gpubox.probe
    gpubox.probe.install()
import torch
from torch.utils.data import DataLoader, Dataset

load_s, step_s, workers = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

class Slow(Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        time.sleep(load_s)
        return i

loader = DataLoader(Slow(), batch_size=1, num_workers=workers)
deadline = time.monotonic() + 120  # never outlive a test that failed to stop it
for n, batch in enumerate(loader):
    if n == 0:
        print("first batch", flush=True)
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:  # the training step: busy, not sleeping
        pass
    if time.monotonic() > deadline:
        break
"""


@pytest.mark.parametrize(
    ("workers", "load_s", "step_s", "expected", "attach"),
    [(0, 0.030, 0.020, 0.6, "install"), (2, 0.020, 0.005, 0.5, "run")],
    ids=["workers0-install", "workers2-gpubox-run"],
)
def test_loader_wait_of_a_real_dataloader_is_within_5_points(
    tmp_path: Path, workers: int, load_s: float, step_s: float, expected: float, attach: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    args = [str(load_s), str(step_s), str(workers), attach]
    python = [sys.executable, str(script), *args]
    cmd = python if attach == "install" else [sys.executable, "-m", "gpubox", "run", *python]
    env = dict(os.environ, GPUBOX_RUNTIME_DIR=str(tmp_path / "rt"))
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "first batch\n", child.communicate(timeout=10)[1][-2000:]
        time.sleep(WINDOW_S + 1)  # a whole window of steady state, past the workers' start-up
        box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=1), [child.pid])
        gpubox_env = fake_nvml_env(box.write(tmp_path / "scenario.txt"))
        for _ in range(2):
            res = run_gpubox("top", "--once", "--json", "--interval", "0.05", env=gpubox_env)
            assert res.returncode == 0, res.stderr
            (proc,) = json.loads(res.stdout)["data"]["processes"]
            assert proc["pid"] == child.pid
            assert proc["loader_wait_source"] == "probe", proc
            got = proc["loader_wait"]
            assert abs(got - expected) <= TOLERANCE, f"loader_wait {got:.3f}, expected {expected} ± {TOLERANCE}"
            rate = 1 / max(load_s / max(workers, 1), step_s) if workers else 1 / (load_s + step_s)
            assert proc["batches_per_s"] == pytest.approx(rate, rel=0.15), proc
    finally:
        child.terminate()
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate(timeout=30)
