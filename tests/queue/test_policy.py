"""The placement policy, decided from plain values: no processes, no clock, no database."""

from __future__ import annotations

import copy

from gpubox.queue.policy import (
    PolicyConfig,
    RunningJob,
    Start,
    Wait,
    place_jobs,
)
from tests.queue.builders import gpu, job, run


def test_priority_then_kind_then_submission_then_id() -> None:
    pending = [
        job(1, "batch", priority=0, at=1),
        job(2, "infer", priority=0, at=5),
        job(3, "train", priority=5, at=9),
        job(4, "infer", priority=0, at=2),
        job(5, "infer", priority=0, at=2),
    ]
    starts, waits = place_jobs(pending, [], [gpu(i) for i in range(5)], now=0)
    assert [s.job_id for s in starts] == [3, 4, 5, 2, 1]
    assert [s.gpu_uuids for s in starts] == [("GPU-0",), ("GPU-1",), ("GPU-2",), ("GPU-3",), ("GPU-4",)]
    assert waits == []


def test_kind_order_is_configurable() -> None:
    config = PolicyConfig(kind_order=("batch", "train", "infer", "quantize", "other"))
    starts, waits = place_jobs([job(1, "infer"), job(2, "batch", at=1)], [], [gpu(0)], now=0, config=config)
    assert starts == [Start(2, ("GPU-0",))]
    assert waits == [Wait(1, "needs 1 GPU: GPU 0 held by job 2 (batch)")]


def test_exclusive_gpu_held_by_running_job() -> None:
    starts, waits = place_jobs([job(7)], [run(12, "GPU-0")], [gpu(0), gpu(1)], now=0)
    assert starts == [Start(7, ("GPU-1",))]
    starts, waits = place_jobs([job(7, gpus=2)], [run(12, "GPU-1")], [gpu(0), gpu(1)], now=0)
    assert starts == []
    assert waits == [Wait(7, "needs 2 GPUs: GPU 1 held by job 12 (train)")]


def test_share_jobs_colocate_where_memory_fits() -> None:
    running = [run(12, "GPU-0", kind="infer", share=True)]
    gpus = [gpu(0, used_gib=30)]
    starts, waits = place_jobs([job(1, "infer", mem_gib=20, share=True)], running, gpus, now=0)
    assert starts == [Start(1, ("GPU-0",))]
    starts, waits = place_jobs([job(1, "infer", mem_gib=60, share=True)], running, gpus, now=0)
    assert waits == [Wait(1, "needs 1 GPU with 60.0 GiB free: GPU 0 has 50.0 GiB free")]


def test_share_jobs_take_gpus_nobody_uses_before_sharing_one() -> None:
    gpus = [gpu(i) for i in range(4)]
    running: list[RunningJob] = []
    placed = []
    for job_id in range(1, 7):  # one at a time, each running when the next is placed
        (start,), _ = place_jobs([job(job_id, share=True)], running, gpus, now=0)
        placed.append(start.gpu_uuids[0])
        running.append(run(job_id, *start.gpu_uuids, share=True))
    assert sorted(placed[:4]) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert placed[4] != placed[5]  # then shared, each GPU by two at most
    # Started in one pass, they spread too.
    starts, _ = place_jobs([job(i, at=i, share=True) for i in range(1, 4)], [], gpus, now=0)
    assert sorted(s.gpu_uuids[0] for s in starts) == ["GPU-0", "GPU-1", "GPU-2"]


def test_share_does_not_mix_with_exclusive_jobs() -> None:
    starts, waits = place_jobs([job(1, share=True)], [run(12, "GPU-0")], [gpu(0)], now=0)
    assert (starts, waits) == ([], [Wait(1, "needs 1 GPU: GPU 0 held by job 12 (train)")])
    _, waits = place_jobs([job(1)], [run(12, "GPU-0", kind="infer", share=True)], [gpu(0)], now=0)
    assert waits == [Wait(1, "needs 1 GPU: GPU 0 held by job 12 (infer)")]


def test_share_jobs_started_together_reserve_memory() -> None:
    pending = [job(1, mem_gib=50, share=True), job(2, at=1, mem_gib=50, share=True)]
    starts, waits = place_jobs(pending, [], [gpu(0)], now=0)
    assert starts == [Start(1, ("GPU-0",))]
    assert waits == [Wait(2, "needs 1 GPU with 50.0 GiB free: GPU 0 has 30.0 GiB free")]


def test_memory_filter_counts_usage_outside_the_queue() -> None:
    gpus = [gpu(0, used_gib=68), gpu(1), gpu(2, used_gib=10), gpu(3, used_gib=68)]
    starts, waits = place_jobs([job(1, gpus=2, mem_gib=60)], [], gpus, now=0)
    assert starts == [Start(1, ("GPU-1", "GPU-2"))]
    starts, waits = place_jobs([job(1, gpus=2, mem_gib=60)], [run(12, "GPU-1")], gpus, now=0)
    assert waits == [
        Wait(
            1,
            "needs 2 GPUs with 60.0 GiB free: GPU 0 has 12.0 GiB free, "
            "GPU 1 held by job 12 (train), GPU 3 has 12.0 GiB free",
        )
    ]


def test_no_gpu_big_enough_and_too_many_gpus() -> None:
    starts, waits = place_jobs([job(1, mem_gib=100), job(2, gpus=3, at=1)], [], [gpu(0), gpu(1)], now=0)
    assert starts == []
    assert waits == [Wait(1, "no GPU on this box has 100.0 GiB"), Wait(2, "needs 3 GPUs; this box has 2 GPUs")]


def test_impossible_job_does_not_hold_the_queue() -> None:
    starts, waits = place_jobs([job(1, priority=9, mem_gib=100), job(2)], [], [gpu(0)], now=0)
    assert starts == [Start(2, ("GPU-0",))]
    assert waits == [Wait(1, "no GPU on this box has 100.0 GiB")]


def test_paused_gpu_is_skipped() -> None:
    starts, waits = place_jobs([job(1)], [], [gpu(0, paused=True), gpu(1)], now=0)
    assert starts == [Start(1, ("GPU-1",))]
    starts, waits = place_jobs([job(1)], [], [gpu(2, paused=True)], now=0)
    assert waits == [Wait(1, "needs 1 GPU: GPU 2 is paused")]


def test_explicit_gpus_override_the_count() -> None:
    gpus = [gpu(0), gpu(1), gpu(2)]
    starts, waits = place_jobs([job(1, gpus=1, ids=("GPU-2", "GPU-0"))], [], gpus, now=0)
    assert starts == [Start(1, ("GPU-0", "GPU-2"))]
    starts, waits = place_jobs([job(1, ids=("GPU-2",))], [run(4, "GPU-2", kind="batch")], gpus, now=0)
    assert waits == [Wait(1, "needs GPU 2: GPU 2 held by job 4 (batch)")]


def test_explicit_gpu_that_does_not_exist() -> None:
    starts, waits = place_jobs([job(1, ids=("GPU-9",))], [], [gpu(0)], now=0)
    assert (starts, waits) == ([], [Wait(1, "no GPU GPU-9 on this box")])


def test_cpu_only_jobs_have_their_own_slots() -> None:
    pending = [job(1, gpus=0), job(2, gpus=0, at=1), job(3, at=2)]
    starts, waits = place_jobs(pending, [run(9, "GPU-0")], [gpu(0)], now=0)
    assert starts == [Start(1, ())]
    assert waits == [
        Wait(2, "waits for a CPU-only slot: 1 in use (job 1)"),
        Wait(3, "needs 1 GPU: GPU 0 held by job 9 (train)"),
    ]
    starts, waits = place_jobs([job(2, gpus=0)], [run(5)], [], now=0, config=PolicyConfig(max_cpu_jobs=2))
    assert starts == [Start(2, ())]
    starts, waits = place_jobs([job(2, gpus=0)], [], [], now=0, config=PolicyConfig(max_cpu_jobs=0))
    assert (starts, waits) == ([], [Wait(2, "CPU-only jobs do not run here: queue.max_cpu_jobs is 0")])


def test_head_of_line_blocks_lower_jobs() -> None:
    pending = [job(7, priority=5, gpus=2), job(8, limit=60)]
    running = [run(12, "GPU-0", ends_by=1000)]
    starts, waits = place_jobs(pending, running, [gpu(0), gpu(1)], now=0, config=PolicyConfig(backfill=False))
    assert starts == []
    assert waits == [
        Wait(7, "needs 2 GPUs: GPU 0 held by job 12 (train)"),
        Wait(8, "waits behind job 7 (higher priority)"),
    ]


def test_backfill_allowed_when_it_ends_before_the_blocked_job_could_start() -> None:
    pending = [job(7, priority=5, gpus=2), job(8, limit=600)]
    running = [run(12, "GPU-0", ends_by=1000)]
    starts, waits = place_jobs(pending, running, [gpu(0), gpu(1)], now=400)
    assert starts == [Start(8, ("GPU-1",))]
    assert waits == [Wait(7, "needs 2 GPUs: GPU 0 held by job 12 (train)")]


def test_backfill_refused_without_time_limit_or_when_too_long() -> None:
    running = [run(12, "GPU-0", ends_by=1000)]
    starts, waits = place_jobs([job(7, priority=5, gpus=2), job(8)], running, [gpu(0), gpu(1)], now=400)
    assert starts == []
    assert waits[1] == Wait(8, "waits behind job 7 (higher priority); only a job with a time limit can start ahead")
    starts, waits = place_jobs([job(7, priority=5, gpus=2), job(8, limit=601)], running, [gpu(0), gpu(1)], now=400)
    assert starts == []
    assert waits[1] == Wait(
        8, "waits behind job 7 (higher priority); its time limit of 10m1s ends after job 7 could start (in 10m)"
    )


def test_times_in_reasons_read_as_time_limits_are_written() -> None:
    """Whole seconds up, in the units of --time-limit: not "in 599.25s"."""
    running = [run(12, "GPU-0", ends_by=1000)]
    _, waits = place_jobs([job(7, priority=5, gpus=2), job(8, limit=5400)], running, [gpu(0), gpu(1)], now=400.75)
    assert waits[1] == Wait(
        8, "waits behind job 7 (higher priority); its time limit of 1h30m ends after job 7 could start (in 10m)"
    )


def test_backfill_refused_when_blocked_job_start_is_unknown() -> None:
    for running, gpus in [
        ([run(12, "GPU-0")], [gpu(0), gpu(1)]),
        ([], [gpu(0, paused=True), gpu(1)]),
    ]:
        starts, waits = place_jobs([job(7, priority=5, gpus=2), job(8, limit=1)], running, gpus, now=0)
        assert starts == []
        assert waits[1] == Wait(8, "waits behind job 7 (higher priority); when job 7 can start is not known")
    # Memory held outside the queue may be freed at any moment.
    gpus = [gpu(0, used_gib=70), gpu(1)]
    starts, waits = place_jobs([job(7, priority=5, gpus=2, mem_gib=20), job(8, limit=1)], [], gpus, now=0)
    assert starts == []
    assert waits[1] == Wait(8, "waits behind job 7 (higher priority); when job 7 can start is not known")


def test_backfill_respects_every_blocked_job_ahead() -> None:
    pending = [
        job(7, priority=5, ids=("GPU-0", "GPU-1")),
        job(6, priority=4, ids=("GPU-1", "GPU-2")),
        job(8, limit=500),
    ]
    running = [run(12, "GPU-0", ends_by=1000), run(13, "GPU-2", ends_by=300)]
    starts, waits = place_jobs(pending, running, [gpu(0), gpu(1), gpu(2)], now=0)
    assert starts == []
    assert waits[2] == Wait(
        8, "waits behind job 6 (higher priority); its time limit of 8m20s ends after job 6 could start (in 5m)"
    )


def test_backfill_is_judged_against_the_blocked_jobs_that_want_the_gpus_it_takes() -> None:
    """Job 1 waits for GPU 2 alone, for as long as nobody knows; job 8 would take GPU 1, which
    only job 2 wants, and ends before job 2 could start: job 1 neither holds it up nor is named."""
    gpus = [gpu(0), gpu(1), gpu(2)]
    running = [run(12, "GPU-0", ends_by=1000), run(13, "GPU-2")]
    pending = [job(1, priority=5, ids=("GPU-2",)), job(2, priority=4, ids=("GPU-0", "GPU-1"))]
    starts, waits = place_jobs([*pending, job(8, limit=500)], running, gpus, now=0)
    assert starts == [Start(8, ("GPU-1",))]
    assert [w.job_id for w in waits] == [1, 2]
    starts, waits = place_jobs([*pending, job(8, limit=1500)], running, gpus, now=0)
    assert starts == []
    assert waits[2] == Wait(
        8, "waits behind job 2 (higher priority); its time limit of 25m ends after job 2 could start (in 16m40s)"
    )


def test_a_job_waiting_behind_a_refused_one_is_named_after_it() -> None:
    """Job 2 waits behind job 1 for GPUs 1 and 2; job 3 would take GPU 2, which job 1 cannot
    use: it is held up by job 2, and says so."""
    gpus = [gpu(0), gpu(1), gpu(2, total_gib=24)]
    pending = [job(1, gpus=2, mem_gib=60), job(2, at=1, ids=("GPU-1", "GPU-2")), job(3, at=2, ids=("GPU-2",))]
    starts, waits = place_jobs(pending, [run(9, "GPU-0", ends_by=100)], gpus, now=0)
    assert starts == []
    assert waits[1].reason == "waits behind job 1 (ahead in the queue); only a job with a time limit can start ahead"
    assert waits[2].reason == "waits behind job 2 (ahead in the queue); only a job with a time limit can start ahead"


def test_a_job_waiting_behind_another_may_start_sooner_on_other_gpus_and_is_not_delayed() -> None:
    """Job 2 waits behind job 1 (GPU 1 frees at 100) for now, but at 10, when GPU 3 frees, it can
    start on GPUs 2 and 3, which job 1 does not want: job 3, which would hold GPU 2 until 50,
    would delay it, and does not start."""
    gpus = [gpu(0), gpu(1), gpu(2), gpu(3)]
    pending = [job(1, priority=2, ids=("GPU-0", "GPU-1")), job(2, priority=1, gpus=2), job(3, ids=("GPU-2",), limit=50)]
    running = [run(90, "GPU-1", ends_by=100), run(91, "GPU-3", ends_by=10)]
    starts, waits = place_jobs(pending, running, gpus, now=0)
    assert starts == []
    assert waits[2] == Wait(
        3, "waits behind job 2 (higher priority); its time limit of 50s ends after job 2 could start (in 10s)"
    )
    # Ending before GPU 3 frees, it delays nobody.
    starts, _ = place_jobs([*pending[:2], job(3, ids=("GPU-2",), limit=5)], running, gpus, now=0)
    assert starts == [Start(3, ("GPU-2",))]


def test_a_job_takes_the_gpu_whose_waiting_job_it_may_pass() -> None:
    """GPUs 0 and 1 both fit job 3 (60 GiB); job 1 waits for GPU 0 and could start at 100, job 2
    for GPU 1 at 300: job 3 (200 s) passes job 2 on GPU 1, where on GPU 0 it would delay job 1."""
    gpus = [gpu(0), gpu(1), gpu(2), gpu(3, total_gib=40), gpu(4), gpu(5)]
    pending = [job(1, ids=("GPU-0", "GPU-4")), job(2, priority=2, at=1, ids=("GPU-1", "GPU-5"))]
    running = [run(100, "GPU-4", ends_by=100), run(101, "GPU-5", ends_by=300), run(102, "GPU-2", ends_by=50)]
    starts, _ = place_jobs([*pending, job(3, mem_gib=60, limit=200)], running, gpus, now=0)
    assert starts == [Start(3, ("GPU-1",))]


def test_a_waiting_job_could_start_when_enough_of_its_gpus_are_free_of_every_holder() -> None:
    """Job 4 needs GPUs 2 and 1; GPU 1 is held until 19, so it cannot start before 19, although
    job 2, on GPU 2, ends at 5: job 3 (sharing GPU 1, ending at 12) passes it."""
    running = [run(100, "GPU-1", ends_by=19, share=True), run(2, "GPU-2", ends_by=5)]
    pending = [job(4, "infer", ids=("GPU-2", "GPU-1"), limit=29), job(3, ids=("GPU-0", "GPU-1"), limit=8, share=True)]
    starts, _ = place_jobs(pending, running, [gpu(0), gpu(1), gpu(2)], now=4)
    assert starts == [Start(3, ("GPU-0", "GPU-1"))]


def test_a_job_waiting_for_a_paused_gpu_holds_up_only_jobs_that_need_that_gpu() -> None:
    """Maintenance on one GPU must not idle the box: the job pinned to it waits, and the jobs
    behind it start on the other GPUs, with no time limit, which cannot delay it."""
    gpus = [gpu(0, paused=True), gpu(1), gpu(2)]
    pending = [job(1, ids=("GPU-0",)), job(2, at=1), job(3, at=2, gpus=2), job(4, at=3, ids=("GPU-0",))]
    starts, waits = place_jobs(pending, [], gpus, now=0)
    assert starts == [Start(2, ("GPU-1",))]
    assert waits == [
        Wait(1, "needs GPU 0: GPU 0 is paused"),
        Wait(3, "needs 2 GPUs: GPU 0 is paused, GPU 1 held by job 2 (train)"),
        Wait(4, "needs GPU 0: GPU 0 is paused"),
    ]
    # The same with backfill off: passing on GPUs the job ahead can never use delays it in no way.
    config = PolicyConfig(backfill=False)
    assert place_jobs(pending[:2], [], gpus, now=0, config=config)[0] == [Start(2, ("GPU-1",))]


def test_memory_held_outside_the_queue_holds_up_only_the_jobs_that_need_that_gpu() -> None:
    gpus = [gpu(0), gpu(1, used_gib=70), gpu(2)]
    pending = [job(1, ids=("GPU-1",), mem_gib=20), job(2, at=1), job(3, at=2), job(4, at=3)]
    starts, waits = place_jobs(pending, [], gpus, now=0)
    # GPU 1 has room for a job that asks for no memory, but job 1 waits for it: it is not taken.
    assert starts == [Start(2, ("GPU-0",)), Start(3, ("GPU-2",))]
    assert waits[0] == Wait(1, "needs GPU 1 with 20.0 GiB free: GPU 1 has 10.0 GiB free")
    assert waits[1] == Wait(4, "waits behind job 1 (ahead in the queue); only a job with a time limit can start ahead")


def test_a_job_that_can_use_only_other_gpus_passes_a_blocked_job() -> None:
    """Job 1 needs 60 GiB GPUs (only GPUs 0 and 1 have that much): a job on the small GPU passes."""
    gpus = [gpu(0), gpu(1), gpu(2, total_gib=24)]
    running = [run(9, "GPU-0")]
    pending = [job(1, gpus=2, mem_gib=60), job(2, at=1), job(3, at=2, limit=60)]
    starts, waits = place_jobs(pending, running, gpus, now=0)
    assert starts == [Start(2, ("GPU-2",))]
    assert waits == [
        Wait(1, "needs 2 GPUs with 60.0 GiB free: GPU 0 held by job 9 (train)"),
        Wait(3, "waits behind job 1 (ahead in the queue); when job 1 can start is not known"),
    ]


def test_a_job_waiting_behind_a_blocked_one_keeps_its_gpus_from_jobs_further_back() -> None:
    """Job 2 waits behind job 1 and could use GPU 2, which job 1 cannot: job 3, further back and
    without a time limit, does not take it (it could outlive job 1 and delay job 2)."""
    gpus = [gpu(0), gpu(1), gpu(2, total_gib=24)]
    pending = [job(1, gpus=2, mem_gib=60), job(2, at=1, gpus=2), job(3, at=2)]
    starts, waits = place_jobs(pending, [run(9, "GPU-0")], gpus, now=0)
    assert starts == []
    assert [w.job_id for w in waits] == [1, 2, 3]
    assert waits[2].reason == "waits behind job 1 (ahead in the queue); only a job with a time limit can start ahead"


def test_a_backfilled_job_takes_gpus_the_blocked_job_cannot_use_first() -> None:
    gpus = [gpu(0), gpu(1), gpu(2, total_gib=24)]
    running = [run(9, "GPU-0", ends_by=1000)]
    pending = [job(1, gpus=2, mem_gib=60), job(2, at=1, gpus=2, limit=100)]
    starts, _ = place_jobs(pending, running, gpus, now=0)
    assert starts == [Start(2, ("GPU-1", "GPU-2"))]  # backfill: it ends before GPU 0 frees


def test_pure_same_inputs_same_outputs_and_nothing_mutated() -> None:
    pending = [job(7, priority=5, gpus=2), job(8, limit=600), job(9, gpus=0), job(10, share=True, mem_gib=1)]
    running = [run(12, "GPU-0", ends_by=1000)]
    gpus = [gpu(0), gpu(1), gpu(2, used_gib=5)]
    before = copy.deepcopy((pending, running, gpus))
    first = place_jobs(pending, running, gpus, now=400)
    second = place_jobs(pending, running, gpus, now=400)
    assert first == second
    assert (pending, running, gpus) == before
    assert place_jobs(list(reversed(pending)), running, gpus, now=400) == first
