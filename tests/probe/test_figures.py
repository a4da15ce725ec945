"""The probe's figures, read from another process while a real DataLoader loop runs."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from gpubox.probe import layout
from gpubox.probe.recorder import start_ticks
from tests.probe.support import Running, only_record, probe_files, python_cmd, requires_torch, write_program

pytestmark = requires_torch

LOOP = """
import gpubox.probe; gpubox.probe.install()
import torch
from torch.utils.data import DataLoader

workers, n, sleep, step = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
it = iter(DataLoader(sleepy(n, sleep), batch_size=1, num_workers=workers))
outer = []
for k in range(n):
    batch, took = timed_next(it)
    outer.append(took)
    busy(step)
    if k + 1 == n // 2:
        pause(f"HALF {sum(outer)}")
pause(f"DONE {sum(outer)} {outer[-1]}")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_figures_while_the_loop_runs(tmp_path: Path, runtime: Path, workers: int) -> None:
    n, sleep, step = 16, 0.04, 0.005
    program = write_program(tmp_path, LOOP)
    job = Running(python_cmd(program, str(workers), str(n), str(sleep), str(step)))
    try:
        outer = int(job.wait_for("HALF"))
        half = only_record(runtime, job.proc.pid)
        assert half.batches == n // 2
        # The probe times inside next(): a little less than the program measures around it.
        assert 0.95 * outer - 5e6 <= half.wait_ns <= outer
        if workers == 0:
            assert half.wait_ns >= half.batches * sleep * 1e9
        else:  # two workers deliver one item per sleep / 2; the step uses `step` of it
            assert half.wait_ns >= 0.5 * half.batches * (sleep / 2 - step) * 1e9
        assert half.waiting_since_ns == 0 and half.first_ns <= half.last_ns
        job.go_on()

        outer_total, outer_last = (int(x) for x in job.wait_for("DONE").split())
        files = probe_files(runtime)
        done = layout.read_consistent(files[0])
        assert done.batches == n
        assert 0.95 * outer_total - 5e6 <= done.wait_ns <= outer_total
        assert 0.9 * outer_last - 1e6 <= done.last_wait_ns <= outer_last
        assert sum(b for _, _, b in done.buckets) == n  # all within the last BUCKETS seconds
        assert sum(w for _, w, _ in done.buckets) == done.wait_ns
        wait, rate, covered = done.window(time.monotonic_ns(), 10) or (0.0, 0.0, 0.0)
        assert 0 < wait < 1 and rate > 0 and covered > 0

        pid = job.proc.pid
        assert files[0].name == f"{pid}-{start_ticks(pid)}.probe"
        assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
        assert (done.pid, done.start_ticks) == (pid, start_ticks(pid))
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert "gpubox probe" not in err
    assert probe_files(runtime) == []  # removed at exit


def test_a_wait_in_progress_is_marked(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        """
        import gpubox.probe; gpubox.probe.install()
        from torch.utils.data import DataLoader, Dataset

        class Blocks(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                if i == 2:
                    pause("BLOCKED")
                return i

        print(sum(int(b) for b in DataLoader(Blocks())))
        """,
    )
    job = Running(python_cmd(program))
    try:
        job.wait_for("BLOCKED")
        time.sleep(0.05)
        record = only_record(runtime, job.proc.pid)
        assert record.batches == 2
        assert record.waiting_since_ns >= record.last_ns > 0
        assert (record.window(time.monotonic_ns(), 10) or (0.0,))[0] > 0
        job.go_on()
        code, out, err = job.finish()
    finally:
        job.kill()
    assert code == 0 and out.splitlines()[-1] == "6", err


def test_train_and_eval_loaders_both_count(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        """
        import gpubox.probe; gpubox.probe.install()
        from torch.utils.data import DataLoader

        train = DataLoader(sleepy(6, 0.001), batch_size=2, shuffle=True)
        evaluate = DataLoader(sleepy(5, 0.001), batch_size=1)
        seen = 0
        for epoch in range(2):
            for batch in train:
                seen += 1
            for batch in evaluate:
                seen += 1
        pause(f"DONE {seen}")
        """,
    )
    job = Running(python_cmd(program))
    try:
        seen = int(job.wait_for("DONE"))
        record = only_record(runtime, job.proc.pid)
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert seen == 2 * (3 + 5) == record.batches  # the StopIteration that ends an epoch is no batch
    assert record.waiting_since_ns == 0


def test_exceptions_pass_through_unchanged_and_are_timed(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        """
        import gpubox.probe; gpubox.probe.install()
        from torch.utils.data import DataLoader, Dataset
        from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

        class Fails(Dataset):
            def __len__(self):
                return 6

            def __getitem__(self, i):
                time.sleep(0.02)
                if i == 3:
                    raise ValueError("item 3 is bad")
                return i

        try:
            for batch in DataLoader(Fails()):
                pass
        except ValueError as exc:
            print("RAISED", type(exc).__name__, exc)

        it = iter(DataLoader(sleepy(2, 0.0)))
        next(it), next(it)
        try:
            next(it)
        except StopIteration as exc:
            print("STOPPED", type(exc).__name__, exc.args)

        class OwnNext(_SingleProcessDataLoaderIter):  # overrides __next__ and calls super()
            def __next__(self):
                return super().__next__()

        print("OWN", len(list(OwnNext(DataLoader(sleepy(4, 0.0))))))
        pause("DONE")
        """,
    )
    job = Running(python_cmd(program))
    try:
        job.wait_for("DONE")
        record = only_record(runtime, job.proc.pid)
        job.go_on()
        code, out, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert "RAISED ValueError item 3 is bad" in out
    assert "STOPPED StopIteration ()" in out
    assert "OWN 4" in out
    assert record.batches == 3 + 2 + 4  # a call that raised returned no batch; OwnNext counts once
    assert record.wait_ns >= 4 * 0.02e9  # the failed item's wait counts too
    assert record.waiting_since_ns == 0


def test_file_removed_when_the_program_dies_of_an_exception(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        """
        import gpubox.probe; gpubox.probe.install()
        from torch.utils.data import DataLoader

        for batch in DataLoader(sleepy(3, 0.0)):
            pass
        pause("LOOPED")
        raise RuntimeError("training diverged")
        """,
    )
    job = Running(python_cmd(program))
    try:
        job.wait_for("LOOPED")
        assert only_record(runtime, job.proc.pid).batches == 3
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 1 and "RuntimeError: training diverged" in err
    assert probe_files(runtime) == []
