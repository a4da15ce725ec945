"""The daemon's recording thread: it records nothing until the daemon has said which jobs run, so
the first samples after a start never give a job's GPU time to nobody; it survives a bad sample;
it writes what it holds when stopped."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.sampler import LedgerSampler
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot
from tests.ledger.builders import gpu, job, snap


class Box:
    """A backend whose samples are one interval (0.01 s) apart; it can fail once, or from a sample on."""

    def __init__(self, fail_at: int | None = None, fail_from: int | None = None) -> None:
        self.t, self.samples, self.fail_at, self.closed = 1_700_000_000.0, 0, fail_at, False
        self.fail_from = fail_from
        self.sampled = threading.Event()

    def sample(self) -> BoxSnapshot:
        self.samples += 1
        self.t += 0.01  # sample time, one interval apart
        if self.samples == self.fail_at:
            raise RuntimeError("a driver hiccup")
        if self.fail_from is not None and self.samples >= self.fail_from:
            if self.samples >= 20:
                self.sampled.set()
            raise RuntimeError("the driver is gone")
        if self.samples >= 8 and self.fail_from is None:
            self.sampled.set()
        return snap(self.t, [gpu("GPU-0", 0, gpu_busy=100.0)])

    def close(self) -> None:
        self.closed = True


def run(tmp_path: Path, box: Box, allocations: Any, open_backend: Any = None) -> tuple[list[str], LedgerStore]:
    logs: list[str] = []
    sampler = LedgerSampler(
        tmp_path / "ledger.db",
        interval_s=0.01,
        retention_days=400,
        minute_retention_days=35,
        open_backend=open_backend or (lambda: box),
        allocations=allocations,
        waiting=dict,
        log=logs.append,
    )
    sampler.start()
    assert box.sampled.wait(10), "the sampler never sampled"
    sampler.stop()
    assert box.closed and not sampler.recording
    return logs, LedgerStore(tmp_path / "ledger.db", create=False)


def test_nothing_is_recorded_until_the_daemon_says_which_jobs_run(tmp_path: Path) -> None:
    said: list[list[Allocation] | None] = [None]
    box = Box()
    # Until then the sampler takes no sample at all: count calls instead.
    calls = {"n": 0}

    def counted() -> list[Allocation] | None:
        calls["n"] += 1
        if calls["n"] >= 3:
            said[0] = [job(1, "GPU-0")]
        return said[0]

    logs, store = run(tmp_path, box, counted)
    with store:
        [(allocated, observed)] = store.rows("SELECT SUM(allocated_ms), SUM(observed_ms) FROM gpu_minutes")
    # Every recorded interval had its holder: the GPU's observed time is all allocated time.
    assert observed > 0 and allocated == observed, (allocated, observed)
    assert logs == []


def test_a_bad_sample_costs_that_sample_and_the_rest_is_written_on_stop(tmp_path: Path) -> None:
    box = Box(fail_at=3)
    logs, store = run(tmp_path, box, lambda: [job(1, "GPU-0")])
    with store:
        [(observed,)] = store.rows("SELECT SUM(observed_ms) FROM gpu_minutes")
    assert observed > 0
    assert any("a driver hiccup" in line for line in logs), logs


def test_a_failure_that_repeats_every_sample_is_logged_once(tmp_path: Path) -> None:
    box = Box(fail_from=2)
    logs, store = run(tmp_path, box, lambda: [job(1, "GPU-0")])
    store.close()
    assert box.samples >= 20
    assert [line for line in logs if "the driver is gone" in line] == [
        "recording GPU use: RuntimeError: the driver is gone (said again in an hour if it goes on)"
    ]


def test_a_backend_that_fails_to_open_in_an_unexpected_way_is_tried_again(tmp_path: Path, monkeypatch: Any) -> None:
    # Not only "no driver": any error opening NVML is one line in the log and another try later,
    # never the end of the recording thread (GPU use unrecorded until the daemon restarts).
    import gpubox.ledger.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "RETRY_BACKEND_S", 0.01)
    box = Box()
    tries = {"n": 0}

    def open_backend() -> Box:
        tries["n"] += 1
        if tries["n"] <= 3:
            raise RuntimeError("NVML said something odd")
        return box

    logs, store = run(tmp_path, box, lambda: [job(1, "GPU-0")], open_backend)
    store.close()
    assert tries["n"] == 4
    assert logs == ["GPU use is not recorded until NVML answers: RuntimeError: NVML said something odd"]
