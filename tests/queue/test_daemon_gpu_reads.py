"""The daemon reads the GPUs only for jobs that may need one: on a GPU box NVML's first start can
take longer than a short CPU-only job, which should not wait for it."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from gpubox.paths import Paths
from gpubox.queue.daemon import IDLE_POLLS, WINDOW, Daemon
from gpubox.queue.gpus import GpuInfo
from gpubox.queue.jobs import Job
from gpubox.queue.layout import db_path, socket_path
from gpubox.queue.schedule import QueueConfig, plan_pass
from gpubox.queue.store import JobStore
from gpubox.queue.wire import poke
from tests.queue.conftest import NoGpus, wait_until
from tests.queue.test_queue_fast_start import HANG, hold, run_daemon, spec, wait_done


class CountedGpus(NoGpus):
    """A box without GPUs that counts how often the daemon asks."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> list[object]:
        self.reads += 1
        return []


def test_cpu_only_jobs_start_without_reading_the_gpus_and_others_read_them(paths: Paths) -> None:
    source = CountedGpus()
    reads: list[int] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(5)])]
        poke(socket_path(paths))
        wait_done(store, ids)
        assert [store.require(i).state for i in ids] == ["succeeded"] * len(ids)
        reads.append(source.reads)
        # Without --gpus the box decides (here: none, so it runs on the CPU): the GPUs are read.
        auto = store.add_many([dataclasses.replace(spec("true"), gpus=None)])[0].id
        poke(socket_path(paths))
        wait_done(store, [auto])
        assert store.require(auto).state == "succeeded"
        reads.append(source.reads)

    run_daemon(paths, scenario, gpu_source=source)
    assert reads[0] == 0, f"the GPUs were read {reads[0]} times for CPU-only jobs"
    assert reads[1] >= 1


def test_a_long_line_of_cpu_only_jobs_read_whole_once_needs_no_gpu_reading(paths: Paths) -> None:
    """More CPU-only jobs than a pass between timed ones reads (its window), all there when the
    daemon starts: its first pass reads them all and finds no GPU wanted, and while nobody else
    commits, no later pass reads the GPUs for them (a cold queue's second job waited 16 ms for
    NVML). A job another client adds may want one: then they are read again."""
    paths.state_dir.mkdir(parents=True)
    with JobStore(db_path(paths)) as store:
        ids = [j.id for j in store.add_many([spec("true") for _ in range(3 * WINDOW)])]
    source = CountedGpus()
    reads: list[int] = []
    passes: list[bool] = []

    def scenario(daemon: Daemon, store: JobStore) -> None:
        original = daemon._pass

        def counted(store_: JobStore, full: bool = True) -> None:
            passes.append(full)
            original(store_, full)

        daemon._pass = counted  # type: ignore[method-assign]
        wait_done(store, ids)
        assert [store.require(i).state for i in ids] == ["succeeded"] * len(ids)
        reads.append(source.reads)
        auto = store.add_many([dataclasses.replace(spec("true"), gpus=None)])[0].id
        poke(socket_path(paths))
        wait_done(store, [auto])
        reads.append(source.reads)

    run_daemon(paths, scenario, gpu_source=source)
    assert False in passes, "no pass read only a window: the test shows nothing"
    assert reads[0] == 0, f"the GPUs were read {reads[0]} times for CPU-only jobs"
    assert reads[1] >= 1


class OneGpu(CountedGpus):
    def read(self) -> list[object]:
        self.reads += 1
        return [GpuInfo(0, "GPU-0", 80 << 30, 0)]


def test_a_gpu_job_behind_a_full_window_of_cpu_only_jobs_starts_while_they_wait(paths: Paths, tmp_path: Path) -> None:
    # More CPU-only jobs than an event-driven pass reads (its window), all ranked ahead of a GPU
    # job added once they wait: the GPU is free, so the GPU job starts at once, not at the next
    # timed pass (an hour away here), while they wait their turn for the one CPU slot.
    go = tmp_path / "go"
    source = OneGpu()

    def scenario(daemon: Daemon, store: JobStore) -> None:
        cpu = [j.id for j in store.add_many([spec(hold(go)) for _ in range(WINDOW + 8)])]
        poke(socket_path(paths))
        try:
            wait_until(lambda: store.require(cpu[0]).state == "running", HANG, "the first CPU-only job")
            gpu_job = store.add_many([dataclasses.replace(spec("true"), gpus=1)])[0].id
            poke(socket_path(paths))
            wait_done(store, [gpu_job])
            assert store.require(gpu_job).state == "succeeded"
            assert store.require(gpu_job).gpu_uuids == ("GPU-0",)
            assert [store.require(i).state for i in cpu[1:]] == ["queued"] * (len(cpu) - 1)
        finally:
            go.touch()
        wait_done(store, cpu)

    run_daemon(paths, scenario, gpu_source=source, config=QueueConfig(poll_interval_s=3600.0))


def test_gpus_held_or_paused_are_named_by_index_when_only_cpu_only_jobs_wait(paths: Paths) -> None:
    # A daemon started while a GPU job runs (a restart, an upgrade) with only CPU-only jobs queued:
    # `queue ls`/`queue show` name the held GPU, and `daemon status` the paused one, from the
    # GPUs it read. Never read, they show UUIDs ("GPU GPU-0"), and the clients, given an answer,
    # do not read NVML themselves.
    source = OneGpu()
    store = JobStore(db_path(paths))
    try:
        gpu_job = store.add(dataclasses.replace(spec("sleep 60"), gpus=1))
        assert store.mark_started(gpu_job.id, os.getpid(), ("GPU-0",), "boot")
        store.add(spec("true"))
        store.pause()  # nothing starts in this pass: no supervisor is needed
        store.pause("GPU-0")
        daemon = Daemon(paths, QueueConfig(), gpu_source=source, boot="boot", log=lambda _: None)
        daemon._pass(store)
        assert {g.uuid: g.index for g in daemon.last_gpus} == {"GPU-0": 0}
        assert daemon.status(store)["paused_labels"] == ["the queue", "GPU 0"]
    finally:
        store.close()


def test_a_cpu_only_infer_job_waiting_for_a_slot_reads_no_gpu_processes() -> None:
    # Preemption only ever stops batch jobs for infer jobs that need a GPU: a CPU-only infer job
    # waiting for its slot must not read NVML's process lists and /proc (the first opens NVML,
    # which a pass of CPU-only jobs skips; the second walks every process) on every pass.
    batch = Job(7, dataclasses.replace(spec("x"), gpus=1, kind="batch"), "running", 0.0, gpu_uuids=("GPU-0",), pid=1)
    cpu = Job(8, spec("y"), "running", 0.0, pid=2)
    infer = Job(1, dataclasses.replace(spec("z"), kind="infer"), "queued", 1.0)
    asked: list[int] = []

    def job_memory() -> dict[str, None]:
        asked.append(1)
        return {}

    plan = plan_pass([infer], [batch, cpu], {}, [], {}, 5.0, QueueConfig(preempt=True), job_memory=job_memory)
    assert 1 in plan.waits and plan.preempts == []
    assert asked == []


def test_an_idle_daemon_makes_no_timed_pass_that_could_find_nothing(paths: Paths, tmp_path: Path) -> None:
    """A timed pass looks for what no commit shows: a running job's supervisor gone, time passing
    for backfill, GPU memory freed outside the queue. With nothing running, jobs that wait in a
    paused queue, or CPU-only jobs, wait only on commits: the daemon wakes, sees none, and reads
    no job (on a slow machine each such pass cost the idle daemon 1% of a core), and it wakes
    less often. While a job runs, the timed passes go on."""
    go = tmp_path / "go"
    source = OneGpu()
    passes: dict[str, int] = {}

    def scenario(daemon: Daemon, store: JobStore) -> None:
        original = daemon._pass
        count = [0]

        def counted(store_: JobStore, full: bool = True) -> None:
            count[0] += 1
            original(store_, full)

        daemon._pass = counted  # type: ignore[method-assign]
        looked = daemon._state_replaced  # once a wake

        def woken(store_: JobStore) -> str | None:
            wakes[0] += 1
            return looked(store_)

        daemon._state_replaced = woken  # type: ignore[method-assign]
        wakes = [0]

        def passes_over(seconds: float) -> int:
            before, woke = count[0], wakes[0]
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.02)
            passes["wakes"] = wakes[0] - woke
            return count[0] - before

        store.pause()
        ids = [j.id for j in store.add_many([spec("true"), dataclasses.replace(spec("true"), gpus=1)])]
        poke(socket_path(paths))
        wait_until(lambda: set(daemon.reasons) == set(ids), HANG, "the pass that reads the paused jobs")
        reads = source.reads
        passes["paused"] = passes_over(0.6)
        passes["paused wakes"] = passes["wakes"]
        assert source.reads == reads, "the GPUs were read again for a paused queue"
        store.resume()
        poke(socket_path(paths))
        wait_done(store, ids)
        assert [store.require(i).state for i in ids] == ["succeeded", "succeeded"]
        held = store.add_many([spec(hold(go))])[0].id
        poke(socket_path(paths))
        try:
            wait_until(lambda: store.require(held).state == "running", HANG, "the held job")
            passes["running"] = passes_over(0.6)
            passes["running wakes"] = passes["wakes"]
        finally:
            go.touch()
        wait_done(store, [held])
        passes["idle"] = passes_over(0.6)

    run_daemon(paths, scenario, gpu_source=source, config=QueueConfig(poll_interval_s=0.05))
    assert passes["paused"] == 0, f"{passes['paused']} timed passes over a paused queue with nothing running"
    assert passes["running"] >= 3, f"only {passes['running']} timed passes while a job ran"
    assert passes["idle"] <= 1, f"{passes['idle']} timed passes over an empty queue"
    # Idle, it still wakes for commits made without a poke, IDLE_POLLS intervals apart.
    assert passes["running wakes"] >= 6, passes
    assert 1 <= passes["paused wakes"] <= 0.6 / (0.05 * IDLE_POLLS) + 2, passes
