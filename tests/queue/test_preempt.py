"""Which batch jobs to stop for waiting infer jobs, decided from plain values: no processes, no clock."""

from __future__ import annotations

from functools import partial

import pytest

from gpubox.queue.policy import PolicyConfig, place_jobs
from gpubox.queue.preempt import Preempt, choose_preemptions
from tests.queue import builders
from tests.queue.builders import gpu

# Here a waiting job is an infer job and a running one a batch job, unless a test says otherwise.
job = partial(builders.job, kind="infer")
run = partial(builders.run, kind="batch")


def test_batch_job_on_the_only_gpu_is_stopped_for_a_waiting_infer_job() -> None:
    assert choose_preemptions([job(1)], [run(5, "GPU-0")], [gpu(0)], now=0) == [Preempt(5, 1)]


@pytest.mark.parametrize("kind", ["train", "quantize", "infer", "other"])
def test_only_batch_jobs_are_ever_stopped(kind: str) -> None:
    assert choose_preemptions([job(1)], [run(5, "GPU-0", kind=kind)], [gpu(0)], now=0) == []


def test_a_gpu_shared_by_a_batch_and_a_train_job_is_not_freed() -> None:
    running = [run(5, "GPU-0", share=True), run(6, "GPU-0", kind="train", share=True)]
    assert choose_preemptions([job(1)], running, [gpu(0)], now=0) == []


def test_free_gpu_is_used_and_only_the_missing_gpu_is_freed() -> None:
    running = [run(5, "GPU-1"), run(6, "GPU-2")]
    result = choose_preemptions([job(1, gpus=2)], running, [gpu(0), gpu(1), gpu(2)], now=0)
    assert result == [Preempt(6, 1)]


def test_fewest_jobs_are_stopped_even_when_older() -> None:
    # Two GPUs are missing: one older 2-GPU job frees both; two newer 1-GPU jobs would be two stops.
    running = [run(3, "GPU-0", "GPU-1"), run(8, "GPU-2"), run(9, "GPU-3")]
    gpus = [gpu(i) for i in range(4)]
    assert choose_preemptions([job(1, gpus=2)], running, gpus, now=0) == [Preempt(3, 1)]


def test_most_recent_batch_job_is_stopped_when_either_would_do() -> None:
    running = [run(3, "GPU-0"), run(8, "GPU-1"), run(5, "GPU-2")]
    gpus = [gpu(0), gpu(1), gpu(2)]
    assert choose_preemptions([job(1)], running, gpus, now=0) == [Preempt(8, 1)]
    assert choose_preemptions([job(1, gpus=2)], running, gpus, now=0) == [Preempt(8, 1), Preempt(5, 1)]


def test_two_infer_jobs_never_claim_the_same_batch_job() -> None:
    pending = [job(1, at=1), job(2, at=2)]
    assert choose_preemptions(pending, [run(5, "GPU-0")], [gpu(0)], now=0) == [Preempt(5, 1)]
    running = [run(5, "GPU-0"), run(6, "GPU-1")]
    assert choose_preemptions(pending, running, [gpu(0), gpu(1)], now=0) == [Preempt(6, 1), Preempt(5, 2)]


def test_infer_jobs_are_served_in_rank_order() -> None:
    pending = [job(1, priority=0, at=1), job(2, priority=3, at=2)]
    assert choose_preemptions(pending, [run(5, "GPU-0")], [gpu(0)], now=0) == [Preempt(5, 2)]


def test_every_gpu_of_a_stopped_job_is_promised_to_its_infer_job() -> None:
    # Job 9 holds GPUs 0 and 1; it is stopped for job 1, so job 2 may not take GPU 1 and needs job 4 stopped.
    pending = [job(1, at=1), job(2, at=2)]
    gpus = [gpu(0), gpu(1), gpu(2)]
    running = [run(9, "GPU-0", "GPU-1"), run(4, "GPU-2")]
    assert choose_preemptions(pending, running, gpus, now=0) == [Preempt(9, 1), Preempt(4, 2)]
    assert choose_preemptions(pending, running[:1], gpus[:2], now=0) == [Preempt(9, 1)]


def test_a_free_gpu_given_to_one_infer_job_is_not_counted_for_the_next() -> None:
    # Job 1 needs two GPUs: GPU 0 is free and job 6 is stopped for GPU 1. Job 2 cannot count on GPU 0.
    pending = [job(1, gpus=2, at=1), job(2, at=2)]
    running = [run(6, "GPU-1"), run(5, "GPU-2")]
    gpus = [gpu(0), gpu(1), gpu(2)]
    assert choose_preemptions(pending, running, gpus, now=0) == [Preempt(6, 1), Preempt(5, 2)]
    assert choose_preemptions(pending, running[:1], gpus[:2], now=0) == [Preempt(6, 1)]


def test_paused_gpu_is_never_freed() -> None:
    assert choose_preemptions([job(1)], [run(5, "GPU-0")], [gpu(0, paused=True)], now=0) == []
    result = choose_preemptions([job(1)], [run(5, "GPU-0"), run(6, "GPU-1")], [gpu(0), gpu(1, paused=True)], now=0)
    assert result == [Preempt(5, 1)]


def test_impossible_infer_job_gets_nothing() -> None:
    assert choose_preemptions([job(1, mem_gib=100)], [run(5, "GPU-0")], [gpu(0)], now=0) == []
    assert choose_preemptions([job(1, gpus=2)], [run(5, "GPU-0")], [gpu(0)], now=0) == []
    assert choose_preemptions([job(1, ids=("GPU-7",))], [run(5, "GPU-0")], [gpu(0)], now=0) == []


def test_cpu_only_infer_job_gets_nothing() -> None:
    running = [run(5), run(6, "GPU-0")]
    assert choose_preemptions([job(1, gpus=0)], running, [gpu(0)], now=0) == []


def test_explicit_gpu_ids_free_exactly_those_gpus() -> None:
    running = [run(9, "GPU-0"), run(3, "GPU-1")]
    gpus = [gpu(0), gpu(1)]
    assert choose_preemptions([job(1, ids=("GPU-1",))], running, gpus, now=0) == [Preempt(3, 1)]
    assert choose_preemptions([job(1, ids=("GPU-0", "GPU-1"))], running, gpus, now=0) == [
        Preempt(9, 1),
        Preempt(3, 1),
    ]


def test_explicit_gpu_ids_held_by_a_train_job_stop_nothing() -> None:
    running = [run(9, "GPU-0"), run(3, "GPU-1", kind="train")]
    assert choose_preemptions([job(1, ids=("GPU-0", "GPU-1"))], running, [gpu(0), gpu(1)], now=0) == []


def test_shared_batch_job_the_infer_job_can_share_with_is_not_stopped() -> None:
    running = [run(5, "GPU-0", share=True)]
    gpus = [gpu(0, used_gib=30)]
    assert choose_preemptions([job(1, mem_gib=20, share=True)], running, gpus, now=0) == []
    # Sharing needs both sides: an exclusive infer job, or a batch job that does not share, is in the way.
    assert choose_preemptions([job(1, mem_gib=20)], running, gpus, now=0) == [Preempt(5, 1)]
    unshared = [run(5, "GPU-0")]
    assert choose_preemptions([job(1, mem_gib=20, share=True)], unshared, gpus, now=0) == [Preempt(5, 1)]


def test_shared_batch_job_is_stopped_when_the_gpu_lacks_memory() -> None:
    running = [run(5, "GPU-0", share=True)]
    gpus = [gpu(0, used_gib=30)]
    assert choose_preemptions([job(1, mem_gib=60, share=True)], running, gpus, now=0) == [Preempt(5, 1)]


def test_memory_is_judged_on_the_gpus_total_once_its_jobs_are_stopped() -> None:
    # GPU 0 has only 10 GiB free with job 5 on it; stopping job 5 may free up to all 70 GiB used.
    running = [run(5, "GPU-0")]
    assert choose_preemptions([job(1, mem_gib=60)], running, [gpu(0, used_gib=70)], now=0) == [Preempt(5, 1)]


def test_no_batch_job_is_stopped_when_memory_held_outside_the_queue_leaves_too_little() -> None:
    # 50 GiB used, none of it job 5's (a process outside the queue): 30 GiB at most would be free.
    running = [run(5, "GPU-0")]
    assert choose_preemptions([job(1, mem_gib=40)], running, [gpu(0, used_gib=50, by_job_gib={})], now=0) == []
    # Job 5 uses 20 of the 50 GiB: stopping it leaves 50 GiB free, enough.
    fits = [gpu(0, used_gib=50, by_job_gib={5: 20})]
    assert choose_preemptions([job(1, mem_gib=40)], running, fits, now=0) == [Preempt(5, 1)]
    # The job asking for exactly what would be free fits; a byte more does not.
    assert choose_preemptions([job(1, mem_gib=50)], running, fits, now=0) == [Preempt(5, 1)]
    assert choose_preemptions([job(1, mem_gib=50.5)], running, fits, now=0) == []


def test_memory_of_a_queue_job_that_is_not_stopped_stays_used() -> None:
    # An infer job (50 GiB) and a batch job (20 GiB) share GPU 0; stopping the batch job would
    # leave 30 GiB free, not the 40 GiB a third (sharing) job needs.
    running = [run(1, "GPU-0", kind="infer", share=True), run(2, "GPU-0", share=True)]
    gpus = [gpu(0, used_gib=70, by_job_gib={1: 50, 2: 20})]
    assert choose_preemptions([job(3, mem_gib=40, share=True)], running, gpus, now=0) == []
    assert choose_preemptions([job(3, mem_gib=30, share=True)], running, gpus, now=0) == [Preempt(2, 3)]


def test_the_gpu_where_stopping_makes_room_is_the_one_freed() -> None:
    # Job 6 is the newer, but GPU 1 keeps 60 GiB held outside the queue: job 5's GPU is freed.
    running = [run(5, "GPU-0"), run(6, "GPU-1")]
    gpus = [gpu(0, used_gib=10, by_job_gib={5: 10}), gpu(1, used_gib=70, by_job_gib={6: 10})]
    assert choose_preemptions([job(1, mem_gib=40)], running, gpus, now=0) == [Preempt(5, 1)]


def test_memory_held_outside_the_queue_on_a_gpu_without_jobs_counts() -> None:
    # GPU 0 has no queue job but 50 GiB used elsewhere: it cannot be freed, so job 5 on GPU 1 is stopped.
    running = [run(5, "GPU-1")]
    gpus = [gpu(0, used_gib=50), gpu(1, used_gib=10)]
    assert choose_preemptions([job(1, mem_gib=40)], running, gpus, now=0) == [Preempt(5, 1)]
    assert choose_preemptions([job(1, mem_gib=40)], [], gpus[:1], now=0) == []


def test_gpu_too_small_for_the_infer_job_is_not_freed() -> None:
    running = [run(5, "GPU-0"), run(6, "GPU-1")]
    gpus = [gpu(0, total_gib=40), gpu(1, total_gib=80)]
    assert choose_preemptions([job(1, mem_gib=60)], running, gpus, now=0) == [Preempt(6, 1)]


def test_waiting_jobs_of_other_kinds_trigger_nothing() -> None:
    for kind in ("train", "quantize", "batch", "other"):
        assert choose_preemptions([job(1, kind=kind)], [run(5, "GPU-0")], [gpu(0)], now=0) == []


def test_infer_job_that_would_start_anyway_triggers_nothing() -> None:
    pending = [job(1)]
    running = [run(5, "GPU-0")]
    gpus = [gpu(0), gpu(1)]
    starts, _ = place_jobs(pending, running, gpus, now=0)
    assert [s.job_id for s in starts] == [1]
    assert choose_preemptions(pending, running, gpus, now=0) == []


def test_jobs_started_in_the_same_pass_are_neither_stopped_nor_counted_free() -> None:
    # Batch job 20 outranks infer job 1 and takes GPU 0 in this pass; only running job 5 can be stopped.
    pending = [job(20, kind="batch", priority=9), job(1)]
    result = choose_preemptions(pending, [run(5, "GPU-1")], [gpu(0), gpu(1)], now=0)
    assert result == [Preempt(5, 1)]


def test_nothing_is_stopped_when_a_higher_job_would_take_the_freed_gpu() -> None:
    pending = [job(10, kind="train", priority=5), job(1)]
    assert choose_preemptions(pending, [run(5, "GPU-0")], [gpu(0)], now=0) == []


def test_nothing_is_stopped_when_the_infer_job_would_still_wait_its_turn() -> None:
    # Train job 10 needs both GPUs and GPU 1 is held by a train job with no end: job 1 waits behind it.
    pending = [job(10, kind="train", priority=5, gpus=2), job(1, gpus=1)]
    running = [run(5, "GPU-0"), run(4, "GPU-1", kind="train")]
    assert choose_preemptions(pending, running, [gpu(0), gpu(1)], now=0) == []


def test_backfill_rules_are_those_of_place_jobs() -> None:
    # Train job 10 can start at 1000 at the earliest; infer job 1 ends by 100, so it may go ahead.
    running = [run(5, "GPU-0"), run(4, "GPU-1", kind="train", ends_by=1000)]
    gpus = [gpu(0), gpu(1)]
    pending = [job(10, kind="train", priority=5, gpus=2), job(1, limit=100)]
    assert choose_preemptions(pending, running, gpus, now=0) == [Preempt(5, 1)]
    assert choose_preemptions(pending, running, gpus, now=0, config=PolicyConfig(backfill=False)) == []
    late = [job(10, kind="train", priority=5, gpus=2), job(1, limit=2000)]
    assert choose_preemptions(late, running, gpus, now=0) == []


def test_many_gpus_still_choose_the_most_recent_jobs() -> None:
    gpus = [gpu(i) for i in range(40)]
    running = [run(100 + i, f"GPU-{i}") for i in range(40)]
    result = choose_preemptions([job(1, gpus=20)], running, gpus, now=0)
    assert result == [Preempt(i, 1) for i in range(139, 119, -1)]


def test_inputs_are_not_changed() -> None:
    pending = [job(1), job(2, at=1)]
    running = [run(5, "GPU-0"), run(6, "GPU-1")]
    gpus = [gpu(0, used_gib=5), gpu(1, used_gib=5)]
    copies = (list(pending), list(running), list(gpus))
    assert choose_preemptions(pending, running, gpus, now=0) == [Preempt(6, 1), Preempt(5, 2)]
    assert (pending, running, gpus) == copies
