"""The daemon records GPU use while queued jobs run, on the fake NVML with scripted utilisation:
each attempt's allocated time, busy share and energy in the ledger match what the job did."""

from __future__ import annotations

import dataclasses
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from gpubox.ledger.report import build_report
from gpubox.ledger.store import LedgerStore, ledger_path
from gpubox.paths import resolve_paths
from tests.fake_nvml.build import fake_nvml_env
from tests.fake_nvml.scenarios import FakeBox, h100
from tests.queue.conftest import QueueBox, wait_until
from tests.queue.test_queue_gpu_placement import add, start

INTERVAL = 0.2  # ledger.interval for the test: seconds between the daemon's samples
ENERGY_PER_READ_MJ = 50_000  # each read of a GPU's energy counter adds 50 J


def box() -> FakeBox:
    gpus = [
        dataclasses.replace(h100(i), energy_mj=7_000_000_000, energy_mj_per_call=ENERGY_PER_READ_MJ) for i in range(2)
    ]
    return FakeBox(gpus=gpus)


def test_the_daemon_records_each_attempts_gpu_use(queue: QueueBox) -> None:
    fake = box()
    work = start(queue, fake, {"GPUBOX_LEDGER_INTERVAL": str(INTERVAL)})
    job = add(queue, work, "--gpus", "1", "--kind", "train", "--tag", "team=nlp", "--name", "fine-tune")
    queue.wait_state(job, ("running",))
    # A job that needs both GPUs waits while the first job holds one, and the ledger learns why.
    stuck = add(queue, work, "--gpus", "2")
    time.sleep(3.0)  # let the daemon take a dozen samples while the job holds its GPU
    assert queue("queue", "cancel", str(stuck)).returncode == 0  # before the GPUs it waits for free up
    (work / f"release.{job}").touch()
    row = queue.wait_state(job, ("succeeded",))
    ran_s = row["ended_at"] - row["started_at"]
    stopped = queue("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    paths = resolve_paths(queue.env)
    # The daemon writes what its ledger holds as it stops, then removes its socket.
    wait_until(lambda: not queue.socket.exists(), 20.0)

    with LedgerStore(ledger_path(paths), create=False) as store:
        report = build_report(store, row["submitted_at"] - 60, time.time() + 60, by="job")
        by_gpu = build_report(store, row["submitted_at"] - 60, time.time() + 60, by="gpu")
        waits = store.rows("SELECT reason, job_ms FROM wait_reasons")
    assert len(waits) == 1, waits
    [(reason, job_ms)] = waits
    assert "held by job N (train)" in reason and job_ms > 1000, waits
    # Both GPUs were watched; only the job's one was allocated, for as long as the job held it.
    held = {r.gpu_uuid: r.allocated_gpu_hours * 3600 for r in by_gpu.rows if r.gpu_uuid}
    assert sorted(held) == sorted(g.uuid for g in fake.gpus)
    assert sorted(round(v, 6) for v in held.values())[0] == 0
    [attempt] = [r for r in report.rows if r.job_id == job]
    assert (attempt.kind, attempt.job_name, attempt.attempts) == ("train", "fine-tune", 1)
    allocated_s = attempt.allocated_gpu_hours * 3600
    # Sampled every 0.2 s: the attempt's start and end each land within about one interval.
    assert abs(allocated_s - ran_s) <= 3 * INTERVAL + 0.5, (allocated_s, ran_s)
    # Busy by GPM sm_active where the GPU has it: 45.25% on GPU 0, 46.25% on GPU 1.
    gpu_index = [g.uuid for g in fake.gpus].index(json.loads(row["gpu_uuids"])[0])
    assert attempt.busy_source == "sm_active"
    busy_share = attempt.busy_gpu_hours / attempt.allocated_gpu_hours
    assert abs(busy_share - (45.25 + gpu_index) / 100) < 0.02, busy_share
    # Energy from the counter: 50 J more at every read, one read a sample. How many samples fell
    # in the attempt depends on the sampler's pace on a loaded machine: the GPU's own reads over
    # the time it was watched give that pace.
    per_read_j = ENERGY_PER_READ_MJ / 1000
    [card] = [r for r in by_gpu.rows if r.gpu_uuid == json.loads(row["gpu_uuids"])[0]]
    assert card.observed_gpu_hours is not None and card.energy_kwh is not None
    watched_s, reads = card.observed_gpu_hours * 3600, card.energy_kwh * 3.6e6 / per_read_j
    assert abs(reads - round(reads)) < 0.01, reads  # whole reads of 50 J: no other source of energy
    assert watched_s / INTERVAL / 3 <= reads <= watched_s / INTERVAL * 1.05, (reads, watched_s)
    energy_j = attempt.energy_kwh * 3.6e6
    expected_j = per_read_j * reads * allocated_s / watched_s
    assert abs(energy_j - expected_j) <= 2 * per_read_j, (energy_j, expected_j)
    assert attempt.energy_estimated_kwh in (None, 0)
    # Nothing measured loader wait for this shell job: starved is unknown, never 0.
    assert attempt.starved_gpu_hours is None

    # The exporter's counters come from the same ledger.
    dump = queue("metrics", "dump", "--interval", "0.05")
    assert dump.returncode == 0, dump.stderr
    exported = {
        s.labels["uuid"]: s.value
        for family in text_string_to_metric_families(dump.stdout)
        for s in family.samples
        if s.name == "gpubox_gpu_allocated_seconds_total"
    }
    assert exported.keys() == held.keys()
    # The exporter adds up hour rows, this report (a window under an hour) minute rows: they agree
    # only because each hour row is the sum of its minutes, which a write across a minute broke.
    assert all(abs(exported[u] - held[u]) < 1e-6 for u in held), (exported, held, report.since, report.until)


def test_a_daemon_killed_mid_job_leaves_a_gap_not_a_double_count(queue: QueueBox) -> None:
    import signal

    fake = box()
    scenario = fake.write(queue.home / "scenario.txt")
    queue.extra_env.update(fake_nvml_env(scenario, fake.library_variant, base={}))
    queue.extra_env["GPUBOX_LEDGER_INTERVAL"] = "0.5"  # writes every 6 s; a gap is over 1.5 s
    daemon = queue.start_daemon()
    work = queue.home / "work"
    work.mkdir()
    job = add(queue, work, "--gpus", "1")
    queue.wait_state(job, ("running",))
    time.sleep(8.0)  # past the first write
    daemon.send_signal(signal.SIGKILL)  # what it held since its last write is lost
    daemon.wait()
    time.sleep(3.0)  # longer than the max gap: the new daemon must call this a gap
    queue.start_daemon()
    time.sleep(3.0)
    (work / f"release.{job}").touch()
    row = queue.wait_state(job, ("succeeded",))  # the job outlived the daemon, as always
    ran_s = row["ended_at"] - row["started_at"]
    assert queue("daemon", "stop").returncode == 0
    wait_until(lambda: not queue.socket.exists(), 20.0)

    paths = resolve_paths(queue.env)
    with LedgerStore(ledger_path(paths), create=False) as store:
        report = build_report(store, row["submitted_at"] - 60, time.time() + 60, by="job")
        gaps = store.rows("SELECT started_at, ended_at FROM gaps")
    [attempt] = [r for r in report.rows if r.job_id == job]
    allocated_s = attempt.allocated_gpu_hours * 3600
    # Never more than the job ran (nothing counted twice), and short of it by the time nobody watched.
    assert allocated_s <= ran_s + 1.0, (allocated_s, ran_s)
    assert allocated_s >= ran_s - 15.0, (allocated_s, ran_s)
    assert gaps and all(end - start >= 3.0 for start, end in gaps), gaps
