"""Stack sampling with py-spy against real processes: a torch CPU DataLoader loop whose dataset
sleeps a known time per item and whose step busy-waits a known time, so the share of wall time
blocked on the next batch is known; and the paths where sampling cannot work."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from gpubox.telemetry import stack_sampling
from gpubox.telemetry.stack_sampling import (
    Frame,
    SampledWait,
    StackSampler,
    in_fetch_path,
    parse_raw,
    sampling_available,
)

needs_pyspy = pytest.mark.skipif(
    not sampling_available(), reason="py-spy is not installed (the 'sampling' extra: pip install 'gpubox[sampling]')"
)

TRAIN = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    item_s, step_s, workers, in_thread = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"

    class Slow(Dataset):
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            time.sleep(item_s)
            return torch.zeros(4)

    def train():
        loader = iter(DataLoader(Slow(), batch_size=1, num_workers=workers))
        next(loader)
        print("ready", flush=True)
        waited = 0.0
        while True:
            before = time.monotonic()
            next(loader)
            after = time.monotonic()
            waited += after - before
            while time.monotonic() - after < step_s:
                pass
            print(f"{after} {waited}", flush=True)

    if in_thread:
        worker = threading.Thread(target=train, name="trainer")
        worker.start()
        worker.join()
    else:
        train()
    """
)


class Loop:
    """A training loop in a child process, which reports its own measure of time blocked."""

    def __init__(self, tmp_path: Path, item_s: float, step_s: float, workers: int, in_thread: bool = False) -> None:
        script = tmp_path / "train.py"
        script.write_text(TRAIN)
        argv = [sys.executable, str(script), str(item_s), str(step_s), str(workers), "1" if in_thread else "0"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.progress: list[tuple[float, float]] = []  # (monotonic time, seconds blocked so far)
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at, waited = line.split()
            self.progress.append((float(at), float(waited)))

    def share(self, last_s: float) -> float:
        """The share blocked over about the last `last_s` seconds, by the loop's own clock: what
        really happened, where a busy box made the steps overrun and the design figure wrong."""
        recent = [p for p in self.progress if p[0] >= time.monotonic() - last_s]
        assert len(recent) >= 2, "the loop measured nothing"
        (t0, w0), (t1, w1) = recent[0], recent[-1]
        return (w1 - w0) / (t1 - t0)

    def workers(self) -> list[int]:
        return [child.pid for child in psutil.Process(self.proc.pid).children()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    started: list[Loop] = []

    def start(item_s: float, step_s: float, workers: int, in_thread: bool = False) -> Loop:
        loop = Loop(tmp_path, item_s, step_s, workers, in_thread)
        started.append(loop)
        return loop

    yield start
    for loop in started:
        loop.stop()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A Python process that never touches a DataLoader."""
    code = "import time\nwhile True:\n    time.sleep(0.01)\n    sum(range(20000))\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)  # let the interpreter start
    yield proc
    proc.kill()
    proc.wait()


def wait_for(
    read: Callable[[], SampledWait | None], done: Callable[[SampledWait | None], bool], timeout: float
) -> SampledWait | None:
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = read()
    return value


def enough(n: int) -> Callable[[SampledWait | None], bool]:
    return lambda r: r is not None and r.samples >= n


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpubox-stack-sampler"]


def pyspy_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and child.name() == "py-spy":
                found.append(child)
        except psutil.Error:
            pass
    return found


def assert_near(got: float, expected: float, truth: float) -> None:
    """The sampled share is within 10 points of what the loop itself measured; and of the design
    figure, unless the box was so busy that the loop's steps overran (then only the first holds)."""
    assert abs(got - truth) <= 0.10, f"sampled {got:.3f}, the loop measured {truth:.3f} (by design {expected:.3f})"
    if abs(truth - expected) <= 0.05:
        assert abs(got - expected) <= 0.10, f"sampled {got:.3f}, by design {expected:.3f}"


# Accuracy against real loops. py-spy spaces its samples randomly, so with about 400 samples the
# error of a share near 0.7 is binomial, about 2.3 percentage points: 10 points is four of them.


@needs_pyspy
def test_single_process_loader_matches_the_expected_wait(loops: Callable[..., Loop]) -> None:
    item_s, step_s = 0.03, 0.01
    expected = item_s / (item_s + step_s)  # 0.75
    loop = loops(item_s, step_s, 0)
    sampler = StackSampler(hz=40, window_s=10)
    try:
        sampler.update([loop.proc.pid])
        got = wait_for(lambda: sampler.result(loop.proc.pid), enough(300), 30)
    finally:
        sampler.close()
    assert got is not None and got.fraction is not None, got
    assert got.reason is None
    assert_near(got.fraction, expected, loop.share(10))


@needs_pyspy
def test_two_worker_loader_matches_the_expected_wait_and_workers_read_zero(loops: Callable[..., Loop]) -> None:
    # Two workers each deliver a batch per item_s: one every item_s / 2, of which the step uses step_s.
    item_s, step_s = 0.06, 0.01
    expected = (item_s / 2 - step_s) / (item_s / 2)  # 0.667
    loop = loops(item_s, step_s, 2)
    workers = loop.workers()
    assert len(workers) == 2
    sampler = StackSampler(hz=40, window_s=10)
    try:
        sampler.update([loop.proc.pid, *workers])
        got = wait_for(lambda: sampler.result(loop.proc.pid), enough(300), 30)
        per_worker = [sampler.result(pid) for pid in workers]
    finally:
        sampler.close()
    assert got is not None and got.fraction is not None, got
    assert_near(got.fraction, expected, loop.share(10))
    # A worker spends its time in the dataset fetch, but it is not a trainer waiting for data.
    for worker in per_worker:
        assert worker is not None and worker.fraction is not None and worker.samples >= 100, worker
        assert worker.fraction <= 0.02, worker


@needs_pyspy
def test_a_loop_in_another_thread_counts(loops: Callable[..., Loop]) -> None:
    item_s, step_s = 0.03, 0.01
    expected = item_s / (item_s + step_s)
    loop = loops(item_s, step_s, 0, in_thread=True)
    sampler = StackSampler(hz=100, window_s=4)
    try:
        sampler.update([loop.proc.pid])
        got = wait_for(lambda: sampler.result(loop.proc.pid), enough(350), 20)
    finally:
        sampler.close()
    assert got is not None and got.fraction is not None, got
    assert_near(got.fraction, expected, loop.share(4))


@needs_pyspy
def test_a_process_without_a_dataloader_reads_zero(sleeper: subprocess.Popen[bytes]) -> None:
    sampler = StackSampler(hz=20, window_s=2)
    try:
        sampler.update([sleeper.pid])
        assert sampler_threads(), "update starts the sampling thread"
        got = wait_for(lambda: sampler.result(sleeper.pid), enough(30), 15)
    finally:
        sampler.close()
    assert got == SampledWait(0.0, got.samples if got else 0, None), got


@needs_pyspy
def test_warming_up_then_a_figure(sleeper: subprocess.Popen[bytes]) -> None:
    sampler = StackSampler(hz=10, window_s=2)
    try:
        assert sampler.result(sleeper.pid) is None  # not watched
        sampler.update([sleeper.pid])
        first = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is not None, 5)
        assert first == SampledWait(None, 0, "warming_up"), first
        later = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is not None and r.fraction is not None, 10)
        assert later is not None and later.fraction == 0.0 and later.samples >= 4, later
    finally:
        sampler.close()


@needs_pyspy
def test_pids_take_turns_beyond_the_child_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_sampling, "MAX_CHILDREN", 1)
    code = "import time\nwhile True:\n    time.sleep(0.01)\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    sampler = StackSampler(hz=10, window_s=3)  # 1 s chunks
    try:
        time.sleep(0.3)
        sampler.update([p.pid for p in procs])
        most = 0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            most = max(most, len(pyspy_children()))
            results = [sampler.result(p.pid) for p in procs]
            if all(r is not None and r.fraction is not None for r in results):
                break
            time.sleep(0.05)
        assert most == 1
        assert [r.fraction if r else None for r in results] == [0.0, 0.0, 0.0], results
    finally:
        sampler.close()
        for proc in procs:
            proc.kill()
            proc.wait()


@needs_pyspy
def test_a_pid_that_exits_is_dropped(sleeper: subprocess.Popen[bytes]) -> None:
    sampler = StackSampler(hz=10, window_s=2)
    try:
        sampler.update([sleeper.pid])
        assert wait_for(lambda: sampler.result(sleeper.pid), enough(4), 10) is not None
        sleeper.kill()
        sleeper.wait()
        gone = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is None, 10)
        assert gone is None
        assert not pyspy_children()
    finally:
        sampler.close()


@needs_pyspy
def test_a_pid_no_longer_listed_stops_being_sampled(sleeper: subprocess.Popen[bytes]) -> None:
    sampler = StackSampler(hz=10, window_s=10)  # 5 s chunks: one is running when the pid goes
    try:
        sampler.update([sleeper.pid])
        deadline = time.monotonic() + 5
        while not pyspy_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pyspy_children()
        sampler.update([])
        assert sampler.result(sleeper.pid) is None
        deadline = time.monotonic() + 5
        while pyspy_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pyspy_children()
    finally:
        sampler.close()


@needs_pyspy
def test_a_process_that_is_not_python_reads_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["sleep", "60"])
    sampler = StackSampler(hz=10, window_s=2)
    spawned: list[list[str]] = []
    real_spawn = stack_sampling._spawn
    monkeypatch.setattr(stack_sampling, "_spawn", lambda argv: spawned.append(argv) or real_spawn(argv))
    try:
        sampler.update([proc.pid])
        got = wait_for(lambda: sampler.result(proc.pid), lambda r: r is not None and r.reason != "warming_up", 10)
        assert got == SampledWait(None, 0, "not_supported"), got
        assert sampler.permission_hint is None
        # Known from its executable: py-spy was never started for it.
        assert spawned == []
    finally:
        sampler.close()
        proc.kill()
        proc.wait()


@needs_pyspy
def test_close_stops_the_thread_and_kills_py_spy(sleeper: subprocess.Popen[bytes]) -> None:
    before = set(sampler_threads())
    sampler = StackSampler(hz=10, window_s=10)
    sampler.update([sleeper.pid])
    sampler.update([sleeper.pid, sleeper.pid])  # never a second thread
    assert len(set(sampler_threads()) - before) == 1
    deadline = time.monotonic() + 5
    while not pyspy_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pyspy_children(), "a py-spy child runs while sampling"
    sampler.close()
    assert set(sampler_threads()) - before == set()
    assert not pyspy_children()
    sampler.update([sleeper.pid])  # closed: starts nothing again
    assert set(sampler_threads()) - before == set()


# Where sampling cannot work.


def fake_pyspy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "py-spy"
    path.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'calls'}\n{body}\n")
    path.chmod(0o755)
    return path


def calls(tmp_path: Path) -> int:
    try:
        return len((tmp_path / "calls").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_permission_denied_reads_no_permission_with_one_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: subprocess.Popen[bytes]
) -> None:
    # py-spy's own words when ptrace is refused.
    words = tmp_path / "words"
    words.write_text(
        """Permission Denied: Try running again with elevated permissions by going 'sudo env "PATH=$PATH" !!'\n"""
    )
    body = f"cat {words} >&2; exit 1"
    binary = fake_pyspy(tmp_path, body)
    monkeypatch.setattr(stack_sampling, "find_pyspy", lambda: str(binary))
    sampler = StackSampler(hz=10, window_s=2)
    try:
        sampler.update([sleeper.pid])
        got = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is not None and r.reason != "warming_up", 10)
        assert got == SampledWait(None, 0, "no_permission"), got
        hint = sampler.permission_hint
        assert hint is not None and "\n" not in hint
        assert f"setcap cap_sys_ptrace+ep {binary}" in hint and "root" in hint and "ptrace_scope" in hint
        time.sleep(1.0)
        assert calls(tmp_path) == 1, "a refused pid is left alone for a while"
        assert sampler.result(sleeper.pid) == SampledWait(None, 0, "no_permission")
    finally:
        sampler.close()


@needs_pyspy
def test_permission_denied_for_real_as_an_unprivileged_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: subprocess.Popen[bytes]
) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run py-spy as another user")
    real = stack_sampling.find_pyspy()
    binary = fake_pyspy(tmp_path, f'exec {setpriv} --reuid=65534 --regid=65534 --clear-groups {real} "$@"')
    monkeypatch.setattr(stack_sampling, "find_pyspy", lambda: str(binary))
    sampler = StackSampler(hz=10, window_s=2)
    try:
        sampler.update([sleeper.pid])
        got = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is not None and r.reason != "warming_up", 10)
        assert got == SampledWait(None, 0, "no_permission"), got
        assert sampler.permission_hint is not None
    finally:
        sampler.close()


def test_py_spy_missing_reads_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_sampling, "find_pyspy", lambda: None)
    assert sampling_available() is False
    before = set(sampler_threads())
    sampler = StackSampler()
    sampler.update([os.getpid()])
    assert sampler.result(os.getpid()) == SampledWait(None, 0, "not_measured")
    assert sampler.result(1) is None  # not watched
    assert set(sampler_threads()) - before == set()
    sampler.close()


def test_py_spy_is_found_beside_the_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pyspy(tmp_path, "exit 0")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert stack_sampling.find_pyspy() == str(tmp_path / "py-spy")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert stack_sampling.find_pyspy() == str(tmp_path / "py-spy")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert stack_sampling.find_pyspy() is None


def test_a_hung_py_spy_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: subprocess.Popen[bytes]
) -> None:
    binary = fake_pyspy(tmp_path, "exec sleep 600")
    monkeypatch.setattr(stack_sampling, "find_pyspy", lambda: str(binary))
    monkeypatch.setattr(stack_sampling, "START_TIMEOUT_S", 0.0)
    monkeypatch.setattr(stack_sampling, "FAILURES_BEFORE_ERROR", 1)
    sampler = StackSampler(hz=10, window_s=0.5)  # 1 s chunks: killed after 3 s
    try:
        sampler.update([sleeper.pid])
        got = wait_for(lambda: sampler.result(sleeper.pid), lambda r: r is not None and r.reason == "error", 10)
        assert got == SampledWait(None, 0, "error"), got
        assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "sleep"]
    finally:
        sampler.close()


# Which frames count.


def stack(*names: str, path: str = "torch/utils/data/dataloader.py") -> list[Frame]:
    return [Frame("<module>", "train.py"), *(Frame(n, path) for n in names)]


FETCH = "/usr/lib/python3/site-packages/torch/utils/data/_utils/fetch.py"
WORKER = "/usr/lib/python3/site-packages/torch/utils/data/_utils/worker.py"
PIN = "/usr/lib/python3/site-packages/torch/utils/data/_utils/pin_memory.py"


@pytest.mark.parametrize(
    "frames",
    [
        stack("_BaseDataLoaderIter.__next__", "_SingleProcessDataLoaderIter._next_data"),
        stack(
            "_BaseDataLoaderIter.__next__",
            "_MultiProcessingDataLoaderIter._next_data",
            "_MultiProcessingDataLoaderIter._get_data",
            "_MultiProcessingDataLoaderIter._try_get_data",
        ),
        stack("__next__", "_next_data", path="/opt/venv/lib/python3.10/site-packages/torch/utils/data/dataloader.py"),
        stack("_try_get_data"),
        [*stack("_SingleProcessDataLoaderIter._next_data"), Frame("_MapDatasetFetcher.fetch", FETCH)],
        stack("_DataFetcher.__next__", path="/venv/site-packages/lightning/pytorch/loops/fetchers.py"),
        stack(
            "_PrefetchDataFetcher.__next__",
            "_DataFetcher._fetch_next_batch",
            path="/venv/site-packages/lightning/pytorch/loops/fetchers.py",
        ),
        stack("_fetch_next_batch", path="pytorch_lightning/loops/fetchers.py"),
        stack("fetching_function", path="pytorch_lightning/utilities/fetching.py"),
        [*stack("DataLoaderShard.__iter__", path="accelerate/data_loader.py"), Frame("CustomIter.__next__", "mine.py")],
        stack("DataLoaderDispatcher._fetch_batches", path="accelerate/data_loader.py"),
    ],
)
def test_frames_in_the_fetch_path(frames: list[Frame]) -> None:
    assert in_fetch_path(frames)


@pytest.mark.parametrize(
    "frames",
    [
        stack(),
        [Frame("<module>", "train.py"), Frame("step", "train.py")],
        # A worker process forked from inside `__iter__`: its fetch is not the trainer waiting.
        [
            *stack("DataLoader.__iter__", "_MultiProcessingDataLoaderIter.__init__"),
            Frame("_worker_loop", WORKER),
            Frame("_MapDatasetFetcher.fetch", FETCH),
        ],
        [Frame("Thread.run", "threading.py"), Frame("_pin_memory_loop", PIN), Frame("Queue.get", "queues.py")],
        # Accelerate's generator busy with something other than `next`, e.g. moving a batch.
        [
            *stack("DataLoaderShard.__iter__", path="accelerate/data_loader.py"),
            Frame("send_to_device", "accelerate/utils/operations.py"),
        ],
        stack("SomethingElse.__next__", path="mylib/loader.py"),
        stack("_DataFetcher.__next__", path="mylib/loops/fetchers.py"),  # a fetchers.py that is not Lightning's
    ],
)
def test_frames_outside_the_fetch_path(frames: list[Frame]) -> None:
    assert not in_fetch_path(frames)


def test_parse_raw_counts_each_thread() -> None:
    text = "\n".join(
        [
            "thread (100): MainThread;<module> (train.py:17) 30",
            "thread (100): MainThread;<module> (train.py:16);_BaseDataLoaderIter.__next__ "
            "(/v/torch/utils/data/dataloader.py:725);_SingleProcessDataLoaderIter._next_data "
            "(/v/torch/utils/data/dataloader.py:785) 70",
            "thread (0x7f00): Thread.run (threading.py:982);"
            "_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:59) 100",
            "thread (101);Thread.run (threading.py:982) 100",
            "garbage",
            "",
        ]
    )
    threads = parse_raw(text, 100)
    assert set(threads) == {"100", "0x7f00", "101"}
    assert (threads["100"].main, threads["100"].samples, threads["100"].blocked) == (True, 100, 70)
    assert (threads["0x7f00"].main, threads["0x7f00"].samples, threads["0x7f00"].blocked) == (False, 100, 0)
    assert not threads["101"].main


def test_failure_reasons() -> None:
    reason = stack_sampling.failure_reason
    assert reason("Permission Denied: Try running again with elevated permissions") == "no_permission"
    assert reason("Error: Operation not permitted (os error 1)") == "no_permission"
    assert reason("Error: Failed to find python version from target process") == "not_supported"
    assert reason("Error: Failed to get process executable name.") == "error"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        StackSampler(hz=0)
    with pytest.raises(ValueError):
        StackSampler(window_s=-1)
