"""The memory on a GPU that stopping the queue's jobs would not free, as preemption weighs it:
all the GPU uses, less what the processes of the queue's running jobs hold there."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from gpubox.paths import Paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.gpus import GpuInfo, foreign_memory
from gpubox.queue.jobs import Job, JobSpec
from gpubox.queue.schedule import QueueConfig
from tests.queue.conftest import wait_until

GIB = 1 << 30
GPU = GpuInfo(0, "GPU-0", 80 * GIB, 50 * GIB)


def test_what_the_queues_processes_hold_is_not_foreign() -> None:
    processes = [(10, 20 * GIB), (11, 5 * GIB), (99, 25 * GIB)]
    assert foreign_memory(GPU, processes, {10, 11}) == 25 * GIB
    assert foreign_memory(GPU, processes, set()) == 50 * GIB
    # The driver's own share (used, but no process's) stays foreign too.
    assert foreign_memory(GPU, [(10, 20 * GIB)], {10}) == 30 * GIB


def test_unknown_when_nvml_cannot_say_what_a_queue_process_holds() -> None:
    assert foreign_memory(GPU, [(10, None), (99, 25 * GIB)], {10}) is None
    assert foreign_memory(GPU, [(10, 20 * GIB), (99, None)], {10}) == 30 * GIB  # not ours: in the used total
    assert foreign_memory(GPU, None, {10}) is None


class ProcessesOnGpu0:
    """A GPU source whose GPU 0 holds the given (pid, bytes)."""

    def __init__(self, processes: list[tuple[int, int | None]]) -> None:
        self.list = processes

    def read(self) -> list[GpuInfo]:
        return [GPU]

    def processes(self) -> dict[str, list[tuple[int, int | None]]]:
        return {"GPU-0": self.list}

    def close(self) -> None:
        pass


def test_the_daemon_counts_a_running_jobs_whole_tree_as_the_queues(paths: Paths, tmp_path: Path) -> None:
    # A "supervisor" whose grandchild uses 20 GiB of GPU 0 (`; :` keeps each shell from exec'ing).
    ready = tmp_path / "grandchild.pid"
    (tmp_path / "tree.sh").write_text(f"sh -c 'echo $$ > {ready}; exec sleep 60' & wait\n")
    supervisor = subprocess.Popen(["sh", "-c", f"sh {tmp_path / 'tree.sh'}; :"])
    grandchild = 0
    try:
        wait_until(lambda: ready.exists() and ready.read_text().strip().isdigit(), 30, "the grandchild")
        grandchild = int(ready.read_text())
        source = ProcessesOnGpu0([(grandchild, 20 * GIB), (1, 25 * GIB)])
        daemon = Daemon(paths, QueueConfig(preempt=True), gpu_source=source, log=lambda _: None)
        batch = Job(1, JobSpec(("x",), kind="batch"), "running", 0.0, gpu_uuids=("GPU-0",), pid=supervisor.pid)
        infer = Job(2, JobSpec(("y",), kind="infer", gpu_mem_bytes=40 * GIB), "queued", 0.0)
        assert daemon._foreign_memory([infer], [batch], [GPU]) == {"GPU-0": 30 * GIB}
        # Read only when a preemption may be weighed: an infer job waits and a batch job holds a GPU.
        assert daemon._foreign_memory([], [batch], [GPU]) is None
        assert Daemon(paths, QueueConfig(), gpu_source=source)._foreign_memory([infer], [batch], [GPU]) is None
    finally:
        for pid in (grandchild, supervisor.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        supervisor.wait(timeout=30)
