"""What each running queue job's processes use on each GPU, as preemption weighs it: stopping a
job frees its share, and nothing that other processes or other jobs hold."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpubox.paths import Paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.gpus import GpuInfo, jobs_memory
from gpubox.queue.jobs import Job, JobSpec
from gpubox.queue.schedule import QueueConfig, plan_pass
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import FakeBox, FakeProcess, h100
from tests.queue.conftest import wait_until

GIB = 1 << 30
PID_MAX_LIMIT = 1 << 22  # the kernel never gives a pid above this
GPU = GpuInfo(0, "GPU-0", 80 * GIB, 50 * GIB)


def seen(pid: int) -> bool:
    return True


def test_each_jobs_processes_are_summed_and_other_processes_are_no_jobs() -> None:
    processes = [(10, 20 * GIB), (11, 5 * GIB), (12, 7 * GIB), (99, 25 * GIB)]
    assert jobs_memory(processes, {10: 1, 11: 1, 12: 2}, seen) == ((1, 25 * GIB), (2, 7 * GIB))
    assert jobs_memory(processes, {}, seen) == ()


def test_not_known_when_nvml_cannot_say_what_a_jobs_process_uses() -> None:
    assert jobs_memory([(10, None), (99, 25 * GIB)], {10: 1}, seen) is None
    assert jobs_memory([(10, 20 * GIB), (99, None)], {10: 1}, seen) == ((1, 20 * GIB),)  # not a job's
    assert jobs_memory(None, {10: 1}, seen) is None


def test_not_known_when_nvml_lists_a_process_of_another_pid_namespace() -> None:
    # In a container NVML names host pids: the queue's own processes would pass for strangers'.
    processes = [(98, 20 * GIB), (99, 25 * GIB)]  # host pids; the job's own is 10 in here
    assert jobs_memory(processes, {10: 1}, lambda pid: pid < 98) is None
    assert jobs_memory(processes, {}, lambda pid: pid < 98) == ()  # no job runs: nothing to stop


def test_where_proc_hides_other_users_the_queues_own_processes_still_count() -> None:
    # hidepid: another user's process is not in /proc, but the job's own is listed and matched.
    processes = [(10, 20 * GIB), (99, 25 * GIB)]
    assert jobs_memory(processes, {10: 1}, lambda pid: pid != 99) == ((1, 20 * GIB),)


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


def test_the_daemon_counts_a_jobs_whole_tree_as_that_job(paths: Paths, tmp_path: Path) -> None:
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
        batch = Job(7, JobSpec(("x",), kind="batch"), "running", 0.0, gpu_uuids=("GPU-0",), pid=supervisor.pid)
        assert daemon._job_memory([batch]) == {"GPU-0": ((7, 20 * GIB),)}
        # In a container NVML names the host's pids: a pid above the kernel's largest (2**22)
        # names no process here, and none of the job's own is listed.
        source.list[:] = [(PID_MAX_LIMIT + 1, 20 * GIB), (1, 25 * GIB)]
        assert daemon._job_memory([batch]) == {"GPU-0": None}
    finally:
        for pid in (grandchild, supervisor.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        supervisor.wait(timeout=30)


def test_nvml_lists_a_process_that_computes_and_draws_once(tmp_path: Path) -> None:
    box = FakeBox(gpus=[h100(0)])
    box.gpus[0].memory_used = 60 * GIB
    box.gpus[0].processes += [
        FakeProcess(pid=4242, used_memory=30 * GIB, type="both"),
        FakeProcess(pid=1, used_memory=20 * GIB),
    ]
    scenario = box.write(tmp_path / "scenario.txt")
    code = "import json; from gpubox.queue.gpus import NvmlGpus; print(json.dumps(NvmlGpus().processes()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=fake_nvml_env(scenario, box.library_variant, base=dict(os.environ)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (listed,) = json.loads(out.stdout).values()
    assert sorted(map(tuple, listed)) == [(1, 20 * GIB), (4242, 30 * GIB)]


def test_a_batch_job_is_not_preempted_for_an_infer_job_a_hidden_strangers_memory_leaves_no_room() -> None:
    # GPU 0: 80 GiB, 70 used: 60 by another user's process (hidden from /proc by hidepid), 10 by
    # batch job 7. Infer job 1 needs 40 GiB: with job 7 gone 20 GiB are free, so stopping it would
    # only lose its work.
    gpu0 = GpuInfo(0, "GPU-0", 80 * GIB, 70 * GIB)
    batch = Job(7, JobSpec(("x",), kind="batch"), "running", 0.0, started_at=0.0, gpu_uuids=("GPU-0",), pid=1)
    infer = Job(1, JobSpec(("y",), kind="infer", gpu_mem_bytes=40 * GIB), "queued", 1.0)
    shares = {"GPU-0": jobs_memory([(10, 10 * GIB), (99, 60 * GIB)], {10: 7}, lambda pid: pid == 10)}
    plan = plan_pass([infer], [batch], {}, [gpu0], {}, 5.0, QueueConfig(preempt=True), job_memory=lambda: shares)
    assert 1 in plan.waits and plan.preempts == []
