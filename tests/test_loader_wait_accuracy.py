"""End to end: a real torch DataLoader on the CPU, timed by the probe in the training process,
read from another process by `gpubox top --once --json` while the job runs.

The dataset's __getitem__ sleeps a known time and each training step busy-waits a known time,
so the share of wall time spent waiting for batches is known in advance:

- num_workers=0: the loop loads, then steps: wait = load / (load + step) = 60 / (60 + 40) = 60%.
- num_workers=2: two workers load in parallel, each taking 40 ms a batch, so a batch is ready
  every 20 ms; a 10 ms step then waits 10 ms for each next batch: wait = 10 / 20 = 50%.

The training loop also times its own `next()` calls from outside, so the figure is checked
against what really happened too. On a box so busy that the steps overran (a busy-wait that is
preempted ends late), the expected value no longer holds, and only that check applies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import run_gpubox

pytest.importorskip("torch")

WINDOW_S = 10  # the default top.loader_window
TOLERANCE = 0.05
S = 1_000_000_000

TRAIN = r"""
import json, signal, sys, time
if sys.argv[4] == "install":
    import gpubox.probe
    gpubox.probe.install()
import torch
from torch.utils.data import DataLoader, Dataset

load_s, step_s, workers, report = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[5]
waits, steps = [], []  # (start, end) of each next() and each step, monotonic ns

def dump(*_):
    with open(report + ".tmp", "w") as fh:
        json.dump({"waits": waits, "steps": steps}, fh)
    import os
    os.replace(report + ".tmp", report)

signal.signal(signal.SIGUSR1, dump)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exit cleanly: workers stopped, file removed

class Slow(Dataset):
    def __len__(self):
        return 10**9
    def __getitem__(self, i):
        time.sleep(load_s)
        return i

it = iter(DataLoader(Slow(), batch_size=1, num_workers=workers))
deadline = time.monotonic() + 120  # never outlive a test that failed to stop it
while time.monotonic() < deadline:
    t0 = time.monotonic_ns()
    next(it)
    t1 = time.monotonic_ns()
    if not waits:
        print("first batch", flush=True)
    waits.append((t0, t1))
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:  # the training step: busy, not sleeping
        pass
    steps.append((t1, time.monotonic_ns()))
"""


def share_within(intervals: list[list[int]], start: int, end: int) -> float:
    """The share of [start, end) covered by the intervals."""
    covered = sum(max(0, min(b, end) - max(a, start)) for a, b in intervals)
    return covered / (end - start)


@pytest.mark.parametrize(
    ("workers", "load_s", "step_s", "expected", "attach"),
    [(0, 0.060, 0.040, 0.6, "install"), (2, 0.040, 0.010, 0.5, "run")],
    ids=["workers0-install", "workers2-gpubox-run"],
)
def test_loader_wait_of_a_real_dataloader_is_within_5_points(
    tmp_path: Path, workers: int, load_s: float, step_s: float, expected: float, attach: str
) -> None:
    script, report = tmp_path / "train.py", tmp_path / "report.json"
    script.write_text(TRAIN)
    python = [sys.executable, str(script), str(load_s), str(step_s), str(workers), attach, str(report)]
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
        res = run_gpubox("top", "--once", "--json", "--interval", "0.05", env=gpubox_env)
        read_at = time.monotonic_ns()  # within a moment of when top read the file
        assert res.returncode == 0, res.stderr
        (proc,) = json.loads(res.stdout)["data"]["processes"]
        assert proc["pid"] == child.pid
        assert proc["loader_wait_source"] == "probe", proc
        got = proc["loader_wait"]

        child.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        timings = json.loads(report.read_text())
        # the window as the reader takes it: whole seconds back from the one it reads in
        start = (read_at // S - WINDOW_S + 1) * S
        truth = share_within(timings["waits"], start, read_at)
        assert abs(got - truth) <= TOLERANCE, f"loader_wait {got:.3f}, the loop itself measured {truth:.3f}"

        recent = [b - a for a, b in timings["steps"] if a >= start]
        mean_step = sum(recent) / len(recent) / S
        if mean_step <= 1.1 * step_s:  # the steps ran as designed: the expected value holds
            assert abs(got - expected) <= TOLERANCE, f"loader_wait {got:.3f}, expected {expected} ± {TOLERANCE}"
            rate = 1 / max(load_s / workers, step_s) if workers else 1 / (load_s + step_s)
            assert proc["batches_per_s"] == pytest.approx(rate, rel=0.15), proc
    finally:
        child.terminate()
        try:
            child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate(timeout=30)
