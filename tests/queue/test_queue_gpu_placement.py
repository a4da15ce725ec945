"""GPU placement through the real CLI and daemon, on the fake NVML library.

Every client and the daemon load the fake libnvidia-ml.so.1 (LD_LIBRARY_PATH) and read the same
scenario file, so the queue sees the scenario's GPUs, UUIDs and memory. Each job writes what it
was given (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, its shell's pid) to `seen.<job>.<attempt>`
in the test's work directory, then waits until the test creates `release.<job>` (or two minutes
pass, as a guard against hangs), so the test decides when each job ends.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from gpubox.queue.wire import Unreachable, ask
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import GIB, FakeBox, FakeProcess, h100
from tests.queue.conftest import QueueBox, wait_until

WAIT = 60.0  # a guard against hangs, never a measure of speed

# What a job records, written whole (tmp file, then rename) so the test never reads half of it.
SEEN = "seen.$GPUBOX_JOB_ID.$GPUBOX_JOB_ATTEMPT"
JOB = (
    '{ echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"; echo "ORDER=${CUDA_DEVICE_ORDER-unset}"; echo "PID=$$"; }'
    f" > {SEEN}.tmp && mv {SEEN}.tmp {SEEN}; "
    "i=0; while [ ! -e release.$GPUBOX_JOB_ID ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done"
)


def gpus(n: int, used: dict[int, int] | None = None) -> FakeBox:
    """n H100s; `used` maps a GPU index to memory held there by a process outside the queue
    (the test runner's own pid: a real process, and not a queue job)."""
    box = FakeBox(gpus=[h100(i) for i in range(n)])
    for index, amount in (used or {}).items():
        box.gpus[index].memory_used = amount
        box.gpus[index].processes.append(FakeProcess(pid=os.getpid(), used_memory=amount))
    return box


def uuids_of(box: FakeBox) -> list[str]:
    return [g.uuid for g in box.gpus]


def start(queue: QueueBox, box: FakeBox, env: dict[str, str] | None = None) -> Path:
    """Point every client and the daemon at the box, start the daemon; the jobs' work directory."""
    scenario = box.write(queue.home / "scenario.txt")
    queue.extra_env.update(fake_nvml_env(scenario, box.library_variant, base={}))
    queue.extra_env.update(env or {})
    queue.start_daemon()
    work = queue.home / "work"
    work.mkdir(exist_ok=True)
    return work


def add(queue: QueueBox, work: Path, *options: str) -> int:
    return queue.add("--cwd", str(work), *options, "--shell", "--", JOB)


def refused(queue: QueueBox, work: Path, *options: str) -> Any:
    before = queue.rows("SELECT COUNT(*) FROM jobs")
    result = queue("queue", "add", "--cwd", str(work), *options, "--shell", "--", JOB)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert queue.rows("SELECT COUNT(*) FROM jobs") == before  # nothing was added
    return result


def seen(work: Path, job_id: int, attempt: int = 1) -> dict[str, str]:
    """What the job's attempt was given, once it has written it."""
    path = work / f"seen.{job_id}.{attempt}"
    wait_until(path.exists, timeout=WAIT, what=f"job {job_id} attempt {attempt} to start")
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def release(work: Path, *job_ids: int) -> None:
    for job_id in job_ids:
        (work / f"release.{job_id}").touch()


def running_on(queue: QueueBox, job_id: int) -> list[str]:
    """Wait until the job runs; the GPU UUIDs the database says it holds."""
    row = queue.wait_state(job_id, ("running",), WAIT)
    return list(json.loads(row["gpu_uuids"] or "[]"))


def daemon_reason(queue: QueueBox, job_id: int) -> str | None:
    try:
        view = ask(queue.socket, "view", timeout=2.0)
    except Unreachable:
        return None
    reason = (view.get("reasons") or {}).get(str(job_id))
    return reason if isinstance(reason, str) else None


def listed(queue: QueueBox, job_id: int, reason_part: str) -> dict[str, Any]:
    """The job's record in `queue ls --json`, once the daemon gives it a reason with `reason_part`."""
    wait_until(
        lambda: reason_part in (daemon_reason(queue, job_id) or ""),
        timeout=WAIT,
        what=f"job {job_id} to wait with a reason containing {reason_part!r} (now {daemon_reason(queue, job_id)!r})",
    )
    result = queue("queue", "ls", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["data"]["daemon"] is True
    (record,) = [j for j in doc["data"]["jobs"] if j["id"] == job_id]
    return dict(record)


def attempts(queue: QueueBox, job_id: int) -> list[tuple[Any, ...]]:
    return queue.rows(f"SELECT number, outcome, gpu_uuids FROM attempts WHERE job_id = {job_id} ORDER BY number")


# -- placement by count --------------------------------------------------------------------


def test_one_gpu_jobs_land_on_distinct_uuids_and_a_fifth_waits_for_the_freed_gpu(queue: QueueBox) -> None:
    box = gpus(4)
    uuid = uuids_of(box)
    work = start(queue, box)
    ids = [add(queue, work, "--gpus", "1") for _ in range(4)]
    for k, job_id in enumerate(ids):
        # Lowest free index first; every job gets exactly its GPU's UUID, as the scenario names it.
        assert running_on(queue, job_id) == [uuid[k]]
        got = seen(work, job_id)
        assert (got["CVD"], got["ORDER"]) == (uuid[k], "PCI_BUS_ID")
    assert [queue.job(i)["state"] for i in ids] == ["running"] * 4  # all four at once

    fifth = add(queue, work, "--gpus", "1")
    record = listed(queue, fifth, "held by")
    assert record["state"] == "queued"
    assert record["reason"] == "needs 1 GPU: " + ", ".join(f"GPU {k} held by job {ids[k]} (other)" for k in range(4))
    running = {j["id"]: j for j in json.loads(queue("queue", "ls", "--json").stdout)["data"]["jobs"]}
    for k, job_id in enumerate(ids):
        assert running[job_id]["gpus"] == [k] and running[job_id]["gpu_uuids"] == [uuid[k]]

    release(work, ids[2])
    assert queue.wait_state(ids[2], ("succeeded",), WAIT)["exit_code"] == 0
    assert running_on(queue, fifth) == [uuid[2]]
    assert seen(work, fifth)["CVD"] == uuid[2]
    assert [queue.job(i)["state"] for i in (ids[0], ids[1], ids[3])] == ["running"] * 3
    release(work, *ids, fifth)
    for job_id in (*ids, fifth):
        queue.wait_state(job_id, ("succeeded",), WAIT)


def test_default_is_one_gpu_and_gpus_0_runs_beside_gpu_jobs_with_no_gpu(queue: QueueBox) -> None:
    box = gpus(2)
    uuid = uuids_of(box)
    work = start(queue, box)
    first = add(queue, work)  # no GPU option at all
    assert running_on(queue, first) == [uuid[0]]
    assert seen(work, first)["CVD"] == uuid[0]  # one GPU, not every GPU of the box
    second = add(queue, work)
    assert running_on(queue, second) == [uuid[1]]
    assert seen(work, second)["CVD"] == uuid[1]
    third = add(queue, work)  # a default job is a GPU job: with both GPUs held it waits
    reason = listed(queue, third, "held by")["reason"]
    assert reason == f"needs 1 GPU: GPU 0 held by job {first} (other), GPU 1 held by job {second} (other)"

    cpu = add(queue, work, "--gpus", "0")
    assert running_on(queue, cpu) == []
    got = seen(work, cpu)
    assert got["CVD"] == ""  # set, and empty: CUDA sees no GPU at all (unset would mean every GPU)
    assert got["ORDER"] == "PCI_BUS_ID"
    assert [queue.job(i)["state"] for i in (first, second, cpu)] == ["running"] * 3
    assert queue.job(third)["state"] == "queued"
    release(work, first, second, third, cpu)
    for job_id in (first, second, third, cpu):
        queue.wait_state(job_id, ("succeeded",), WAIT)


def test_gpus_2_gets_two_uuids_in_index_order(queue: QueueBox) -> None:
    box = gpus(4)
    uuid = uuids_of(box)
    work = start(queue, box)
    hold = add(queue, work, "--gpu", "1")
    assert running_on(queue, hold) == [uuid[1]]
    pair = add(queue, work, "--gpus", "2")
    assert running_on(queue, pair) == [uuid[0], uuid[2]]
    assert seen(work, pair)["CVD"] == f"{uuid[0]},{uuid[2]}"
    named = add(queue, work, "--gpu", "3,1")  # named out of order, and GPU 1 is held
    assert f"GPU 1 held by job {hold} (other)" in listed(queue, named, "held by")["reason"]
    release(work, hold)
    assert running_on(queue, named) == [uuid[1], uuid[3]]
    assert seen(work, named)["CVD"] == f"{uuid[1]},{uuid[3]}"
    release(work, pair, named)
    for job_id in (hold, pair, named):
        queue.wait_state(job_id, ("succeeded",), WAIT)


# -- placement by name ---------------------------------------------------------------------


def test_gpu_by_index_and_by_uuid_prefix_and_refusals(queue: QueueBox) -> None:
    box = gpus(4)
    uuid = uuids_of(box)
    work = start(queue, box)
    by_index = add(queue, work, "--gpu", "2")
    assert running_on(queue, by_index) == [uuid[2]]  # GPUs 0 and 1 are free: it still lands on 2
    assert seen(work, by_index)["CVD"] == uuid[2]
    prefix = uuid[3][: len("GPU-a1000003")]
    assert [u for u in uuid if u.startswith(prefix)] == [uuid[3]]
    by_uuid = add(queue, work, "--gpu", prefix)
    assert running_on(queue, by_uuid) == [uuid[3]]
    assert seen(work, by_uuid)["CVD"] == uuid[3]
    assert json.loads(queue.job(by_uuid)["spec"])["gpu_ids"] == [uuid[3]]

    assert "no GPU 9" in refused(queue, work, "--gpu", "9").stderr
    assert "this box has 4" in refused(queue, work, "--gpus", "5").stderr
    release(work, by_index, by_uuid)
    for job_id in (by_index, by_uuid):
        queue.wait_state(job_id, ("succeeded",), WAIT)


# -- memory --------------------------------------------------------------------------------


def test_gpu_mem_skips_a_gpu_without_enough_free_memory(queue: QueueBox) -> None:
    box = gpus(3, used={0: 70 * GIB})
    uuid = uuids_of(box)
    work = start(queue, box)
    job = add(queue, work, "--gpu-mem", "40G")
    assert running_on(queue, job) == [uuid[1]]  # GPU 0 has 9.6 GiB free; GPU 1 is the next that fits
    assert seen(work, job)["CVD"] == uuid[1]
    release(work, job)
    queue.wait_state(job, ("succeeded",), WAIT)


def test_gpu_mem_waits_when_no_gpu_has_it_free_and_is_refused_beyond_any_gpu(queue: QueueBox) -> None:
    box = gpus(2, used={0: 50 * GIB, 1: 50 * GIB})
    work = start(queue, box)
    job = add(queue, work, "--gpu-mem", "40G")
    record = listed(queue, job, "free")
    assert record["state"] == "queued"
    assert record["reason"] == "needs 1 GPU with 40.0 GiB free: GPU 0 has 29.6 GiB free, GPU 1 has 29.6 GiB free"
    assert "more than any GPU has" in refused(queue, work, "--gpu-mem", "100G").stderr
    assert queue.job(job)["state"] == "queued"


def test_memory_of_a_process_outside_the_queue_counts(queue: QueueBox) -> None:
    box = gpus(2, used={0: 70 * GIB})
    uuid = uuids_of(box)
    work = start(queue, box)
    assert queue.rows("SELECT id FROM jobs WHERE state = 'running'") == []  # no queue job holds GPU 0
    job = add(queue, work, "--gpu-mem", "40G")
    assert running_on(queue, job) == [uuid[1]]  # GPU 0 is skipped though no queue job holds it
    pinned = add(queue, work, "--gpu", "0", "--gpu-mem", "40G")
    record = listed(queue, pinned, "free")
    # The reason is memory, not a holder: the only other queue job runs on GPU 1.
    assert record["reason"] == "needs GPU 0 with 40.0 GiB free: GPU 0 has 9.6 GiB free"
    release(work, job, pinned)
    queue.wait_state(job, ("succeeded",), WAIT)
    assert queue.job(pinned)["state"] == "queued"


# -- sharing -------------------------------------------------------------------------------


def test_share_jobs_colocate_when_memory_fits_and_an_exclusive_job_waits(queue: QueueBox) -> None:
    box = gpus(1)
    (uuid,) = uuids_of(box)
    work = start(queue, box)
    a = add(queue, work, "--share", "--gpu-mem", "10G")
    b = add(queue, work, "--share", "--gpu-mem", "10G")
    assert running_on(queue, a) == [uuid] and running_on(queue, b) == [uuid]
    assert seen(work, a)["CVD"] == uuid and seen(work, b)["CVD"] == uuid
    assert [queue.job(i)["state"] for i in (a, b)] == ["running"] * 2  # at once, on the one GPU
    alone = add(queue, work, "--gpus", "1")
    reason = listed(queue, alone, "held by")["reason"]
    assert reason == f"needs 1 GPU: GPU 0 held by job {a} (other) and job {b} (other)"
    release(work, a, b)
    assert running_on(queue, alone) == [uuid]
    assert seen(work, alone)["CVD"] == uuid
    release(work, alone)
    queue.wait_state(alone, ("succeeded",), WAIT)


def test_share_jobs_do_not_overcommit_the_memory_they_declared(queue: QueueBox) -> None:
    # 80 GB GPU; two share jobs each declaring 50 GiB do not fit together. The first has not
    # touched the GPU yet (as a job still loading its model would not have), so only what it
    # declared can keep the second off.
    box = gpus(1)
    (uuid,) = uuids_of(box)
    work = start(queue, box)
    first = add(queue, work, "--share", "--gpu-mem", "50G")
    assert running_on(queue, first) == [uuid]
    second = add(queue, work, "--share", "--gpu-mem", "50G")
    deadline = time.monotonic() + WAIT
    while daemon_reason(queue, second) is None and queue.job(second)["state"] == "queued":
        assert time.monotonic() < deadline, "the daemon never looked at the second job"
        time.sleep(0.05)
    assert queue.job(second)["state"] == "queued", (
        f"job {second} (--share --gpu-mem 50G) started beside job {first} (--share --gpu-mem 50G) on one 79.6 GiB GPU"
    )
    release(work, first)
    queue.wait_state(first, ("succeeded",), WAIT)
    assert running_on(queue, second) == [uuid]
    release(work, second)
    queue.wait_state(second, ("succeeded",), WAIT)


# -- paused GPUs ---------------------------------------------------------------------------


def test_a_paused_gpu_gets_no_job_until_resumed(queue: QueueBox) -> None:
    box = gpus(2)
    uuid = uuids_of(box)
    work = start(queue, box)
    busy = add(queue, work, "--gpu", "0")
    assert running_on(queue, busy) == [uuid[0]]
    paused = queue("queue", "pause", "--gpu", "1")
    assert paused.returncode == 0 and paused.stdout == "GPU 1: paused\n", paused.stderr
    job = add(queue, work, "--gpus", "1")
    record = listed(queue, job, "GPU 1 is paused")
    assert record["state"] == "queued"
    assert record["reason"] == f"needs 1 GPU: GPU 0 held by job {busy} (other), GPU 1 is paused"
    status = queue("daemon", "status")
    assert status.returncode == 0 and "paused: GPU 1\n" in status.stdout, status.stdout
    whole = queue("queue", "resume")  # the queue was not paused; GPU 1 is, and stays so
    assert (whole.returncode, whole.stdout) == (0, "the queue: was not paused\n")
    assert whole.stderr == "gpubox: still paused: GPU 1 (gpubox queue resume --gpu ID, for each)\n"
    resumed = queue("queue", "resume", "--gpu", "1")
    assert resumed.returncode == 0 and resumed.stdout == "GPU 1: resumed\n", resumed.stderr
    assert running_on(queue, job) == [uuid[1]]
    assert seen(work, job)["CVD"] == uuid[1]
    release(work, busy, job)
    for job_id in (busy, job):
        queue.wait_state(job_id, ("succeeded",), WAIT)


def test_a_paused_gpu_taken_out_of_the_box_resumes_by_its_uuid(queue: QueueBox) -> None:
    box = gpus(2)
    uuid = uuids_of(box)
    start(queue, box)
    listed_twice = queue("queue", "pause", "--gpu", "0,1")
    assert (listed_twice.returncode, listed_twice.stdout) == (2, "")
    assert (
        listed_twice.stderr
        == "gpubox: --gpu takes one GPU (an index or a UUID), not the list '0,1': one command each\n"
    )
    assert queue("queue", "pause", "--gpu", "1").returncode == 0
    gpus(1).write(queue.home / "scenario.txt")  # GPU 1 leaves the box (repair, say)
    by_index = queue("queue", "resume", "--gpu", "1")
    assert (by_index.returncode, by_index.stderr) == (2, "gpubox: no GPU 1 on this box (GPUs: 0-0)\n")
    resumed = queue("queue", "resume", "--gpu", uuid[1])
    assert (resumed.returncode, resumed.stdout) == (0, f"GPU {uuid[1]}: resumed\n"), resumed.stderr
    assert queue.rows("SELECT target FROM paused") == []


def test_a_job_pinned_to_a_paused_gpu_does_not_hold_up_jobs_for_the_other_gpus(queue: QueueBox) -> None:
    """Maintenance on one GPU: the job that needs it waits, the jobs behind it run elsewhere."""
    box = gpus(3)
    uuid = uuids_of(box)
    work = start(queue, box)
    assert queue("queue", "pause", "--gpu", "0").returncode == 0
    pinned = add(queue, work, "--gpu", "0")
    others = [add(queue, work) for _ in range(2)]
    assert sorted(running_on(queue, job_id)[0] for job_id in others) == [uuid[1], uuid[2]]
    assert listed(queue, pinned, "GPU 0 is paused")["state"] == "queued"
    assert queue("queue", "resume", "--gpu", "0").returncode == 0
    assert running_on(queue, pinned) == [uuid[0]]
    release(work, pinned, *others)
    for job_id in (pinned, *others):
        queue.wait_state(job_id, ("succeeded",), WAIT)


def test_with_no_daemon_ls_and_show_still_name_gpus_by_index_and_ls_says_it_is_down(queue: QueueBox) -> None:
    box = gpus(2)
    work = start(queue, box)
    job = add(queue, work, "--gpu", "1")
    assert running_on(queue, job) == [uuids_of(box)[1]]
    assert queue("daemon", "stop").returncode == 0
    listed = queue("queue", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (record,) = json.loads(listed.stdout)["data"]["jobs"]
    assert record["gpus"] == [1]
    text = queue("queue", "ls")
    assert text.stderr == "gpubox: the daemon is not running: running jobs' ends are recorded once it runs\n"
    shown = queue("queue", "show", str(job), "--json")
    doc = json.loads(shown.stdout)["data"]
    assert doc["job"]["gpus"] == [1] and doc["attempts"][0]["gpus"] == [1]
    release(work, job)


def test_every_command_names_the_gpus_of_ended_jobs_by_index_while_a_daemon_has_read_none(queue: QueueBox) -> None:
    """A daemon that has run only CPU jobs since it started has read no GPU yet; `gpus` in every
    command's JSON, and the text, still say GPU 1, never its UUID in one command and 1 in another."""
    box = gpus(2)
    work = start(queue, box)
    job = add(queue, work, "--gpu", "1")
    release(work, job)
    assert queue("queue", "wait", str(job)).returncode == 0
    assert queue("daemon", "stop").returncode == 0
    queue.start_daemon()  # a fresh daemon: no GPU job has run or waited since it started
    cpu = queue.add("--gpus", "0", "--", "true")
    assert queue("queue", "wait", str(cpu)).returncode == 0

    def data(*args: str) -> dict[str, Any]:
        result = queue(*args, "--json")
        assert "Traceback" not in result.stderr, result.stderr
        doc: dict[str, Any] = json.loads(result.stdout)["data"]
        return doc

    (listed_job,) = [j for j in data("queue", "ls", "--all")["jobs"] if j["id"] == job]
    shown = data("queue", "show", str(job))
    (waited,) = data("queue", "wait", str(job))["jobs"]
    (cancelled,) = data("queue", "cancel", str(job))["jobs"]  # ended already: it still says which job
    assert [listed_job["gpus"], shown["job"]["gpus"], shown["attempts"][0]["gpus"]] == [[1], [1], [1]]
    assert [waited["gpus"], cancelled["gpus"]] == [[1], [1]]
    text = queue("queue", "show", str(job)).stdout
    assert "on GPU 1;" in text and box.gpus[1].uuid not in text
    row = next(line for line in queue("queue", "ls", "--all").stdout.splitlines() if line.startswith(f"{job} "))
    assert " #1 " in row


def test_retry_and_edit_json_name_the_gpus_a_job_held_by_index_as_ls_does(queue: QueueBox) -> None:
    """A retried job keeps the GPUs its last attempt held; `queue retry --json` and `queue edit
    --json` named them by UUID where ls and show say 1."""
    box = gpus(2)
    work = start(queue, box)
    job = add(queue, work, "--gpu", "1")
    release(work, job)
    assert queue("queue", "wait", str(job)).returncode == 0
    holder = add(queue, work, "--gpu", "1")  # holds GPU 1: the retried job waits for it
    running_on(queue, holder)

    def data(*args: str) -> dict[str, Any]:
        result = queue(*args, "--json")
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        doc: dict[str, Any] = json.loads(result.stdout)["data"]
        return doc

    (retried,) = data("queue", "retry", str(job))["jobs"]
    edited = data("queue", "edit", str(job), "--priority", "5")["job"]
    (listed_job,) = [j for j in data("queue", "ls")["jobs"] if j["id"] == job]
    assert [retried["gpus"], edited["gpus"], listed_job["gpus"]] == [[1], [1], [1]]
    release(work, holder)
    assert queue("queue", "wait", str(job), str(holder)).returncode == 0


# -- preemption ----------------------------------------------------------------------------


def test_an_infer_job_preempts_a_running_batch_job_when_turned_on(queue: QueueBox) -> None:
    box = gpus(1)
    (uuid,) = uuids_of(box)
    work = start(queue, box, env={"GPUBOX_QUEUE_PREEMPT": "1"})
    batch = add(queue, work, "--kind", "batch")
    assert running_on(queue, batch) == [uuid]
    assert seen(work, batch, 1)["CVD"] == uuid
    infer = add(queue, work, "--kind", "infer")

    assert running_on(queue, infer) == [uuid]  # only once the batch job has let go of the GPU
    assert seen(work, infer)["CVD"] == uuid
    row = queue.job(batch)
    assert (row["state"], row["attempt"]) == ("queued", 1)
    assert [(n, outcome) for n, outcome, _ in attempts(queue, batch)] == [(1, "preempted")]
    assert listed(queue, batch, "held by")["reason"] == f"needs 1 GPU: GPU 0 held by job {infer} (infer)"

    release(work, batch, infer)  # the batch job's next attempt ends as soon as it starts
    queue.wait_state(infer, ("succeeded",), WAIT)
    queue.wait_state(batch, ("succeeded",), WAIT)
    assert seen(work, batch, 2)["CVD"] == uuid
    assert attempts(queue, batch) == [(1, "preempted", json.dumps([uuid])), (2, "succeeded", json.dumps([uuid]))]
    assert [(n, outcome) for n, outcome, _ in attempts(queue, infer)] == [(1, "succeeded")]


def test_no_batch_job_is_stopped_for_an_infer_job_that_memory_outside_the_queue_keeps_out(queue: QueueBox) -> None:
    # 50 GiB of the GPU's 80 are held by a process outside the queue: stopping the batch job
    # would leave 30 GiB free, not the 40 GiB the infer job needs. The batch job runs on.
    box = gpus(1, used={0: 50 * GIB})
    work = start(queue, box, env={"GPUBOX_QUEUE_PREEMPT": "1"})
    batch = add(queue, work, "--kind", "batch")
    running_on(queue, batch)
    infer = add(queue, work, "--kind", "infer", "--gpu-mem", "40G")
    assert "needs 1 GPU with 40.0 GiB free" in listed(queue, infer, "held by")["reason"]
    time.sleep(1.0)  # several scheduling passes (poll interval 0.2 s)
    row = queue.job(batch)
    assert (row["state"], row["attempt"], row["request"]) == ("running", 1, None)
    assert [(n, outcome) for n, outcome, _ in attempts(queue, batch)] == [(1, None)]
    release(work, batch, infer)
    queue.wait_state(batch, ("succeeded",), WAIT)


def test_a_batch_job_is_stopped_when_that_makes_room_beside_memory_outside_the_queue(queue: QueueBox) -> None:
    box = gpus(1, used={0: 30 * GIB})  # stopping the batch job leaves 50 GiB free: enough
    (uuid,) = uuids_of(box)
    work = start(queue, box, env={"GPUBOX_QUEUE_PREEMPT": "1"})
    batch = add(queue, work, "--kind", "batch")
    running_on(queue, batch)
    infer = add(queue, work, "--kind", "infer", "--gpu-mem", "40G")
    assert running_on(queue, infer) == [uuid]
    assert [(n, outcome) for n, outcome, _ in attempts(queue, batch)] == [(1, "preempted")]
    release(work, batch, infer)
    queue.wait_state(batch, ("succeeded",), WAIT)


def test_nothing_is_preempted_unless_turned_on(queue: QueueBox) -> None:
    box = gpus(1)
    (uuid,) = uuids_of(box)
    work = start(queue, box)
    batch = add(queue, work, "--kind", "batch")
    assert running_on(queue, batch) == [uuid]
    infer = add(queue, work, "--kind", "infer")
    assert listed(queue, infer, "held by")["reason"] == f"needs 1 GPU: GPU 0 held by job {batch} (batch)"
    time.sleep(1.0)  # several scheduling passes (poll interval 0.2 s)
    row = queue.job(batch)
    assert (row["state"], row["attempt"], row["request"]) == ("running", 1, None)
    assert [(n, outcome) for n, outcome, _ in attempts(queue, batch)] == [(1, None)]
    release(work, batch)
    queue.wait_state(batch, ("succeeded",), WAIT)
    assert running_on(queue, infer) == [uuid]
    release(work, infer)
    queue.wait_state(infer, ("succeeded",), WAIT)
    assert [(n, outcome) for n, outcome, _ in attempts(queue, batch)] == [(1, "succeeded")]


# -- gpubox top names the job --------------------------------------------------------------


def test_top_names_the_queue_job_of_a_gpu_process(queue: QueueBox) -> None:
    box = gpus(1)
    (uuid,) = uuids_of(box)
    work = start(queue, box)
    job = add(queue, work, "--kind", "train")
    assert running_on(queue, job) == [uuid]
    pid = int(seen(work, job)["PID"])  # the job's shell, started by its supervisor
    # A later look at the box: the job's process and a process outside the queue on GPU 0.
    later = gpus(1)
    later.gpus[0].processes = [FakeProcess(pid=pid, used_memory=2 * GIB), FakeProcess(pid=os.getpid())]
    later.gpus[0].memory_used = 3 * GIB
    scenario = later.write(queue.home / "scenario-top.txt")
    result = queue("top", "--once", "--json", "--interval", "0.05", env={"FAKE_NVML_SCENARIO": str(scenario)})
    assert result.returncode == 0, result.stderr
    procs = {p["pid"]: p for p in json.loads(result.stdout)["data"]["processes"]}
    assert (procs[pid]["job_id"], procs[pid]["job_kind"]) == (job, "train")
    assert procs[pid]["gpu_uuid"] == uuid
    assert (procs[os.getpid()]["job_id"], procs[os.getpid()]["job_kind"]) == (None, None)
    release(work, job)
    queue.wait_state(job, ("succeeded",), WAIT)


def test_edit_gpu_given_twice_adds_up_as_in_add(queue: QueueBox) -> None:
    box = gpus(4)
    uuid = uuids_of(box)
    work = start(queue, box)
    assert queue("queue", "pause").returncode == 0
    job = add(queue, work, "--gpu", "0")
    result = queue("queue", "edit", str(job), "--gpu", "1", "--gpu", "3")
    assert result.returncode == 0, result.stderr
    assert json.loads(queue.job(job)["spec"])["gpu_ids"] == [uuid[1], uuid[3]]
