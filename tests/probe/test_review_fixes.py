"""Edges found in review: long waits, stale files, FIFOs, scripts without #!."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpubox.probe import layout, recorder
from gpubox.probe.layout import BUCKET_NS, BUCKETS, FILE_SIZE, MAGIC, S_BUCKETS, parse

S = BUCKET_NS


def _record_with(spread: tuple[int, int], ending: tuple[int, int]) -> layout.ProbeRecord:
    image = bytearray(FILE_SIZE)
    w = memoryview(image).cast("Q")
    w[layout.S_VERSION], w[layout.S_BUCKET_COUNT], w[layout.S_FIRST_NS] = layout.VERSION, BUCKETS, 1
    recorder._spread(w, *spread)
    second, wait = ending
    b = S_BUCKETS + 3 * (second % BUCKETS)
    w[b], w[b + 1], w[b + 2] = second, wait, 1
    w.release()
    image[:8] = MAGIC
    return parse(bytes(image))


def test_a_long_wait_is_spread_over_the_seconds_it_covered() -> None:
    # A 12 s wait from 8.0 s to 20.0 s: 8..19 each get one second, and the batch lands in 20.
    rec = _record_with((8 * S, 20 * S), (20, 0))
    by_second = {s: w for s, w, _ in rec.buckets}
    assert by_second == {s: S for s in range(8, 20)} | {20: 0}
    # 18 s later, the window of the last 10 s holds none of it.
    wait, _, _ = rec.window(38 * S, 10)
    assert wait == 0.0
    # Within the wait's span, each second reads fully blocked.
    assert rec.window(20 * S, 10)[0] == pytest.approx(1.0)


def test_parts_older_than_the_buckets_are_dropped() -> None:
    rec = _record_with((0, 40 * S), (40, 0))
    assert sorted(s for s, _, _ in rec.buckets) == list(range(40 - BUCKETS + 1, 41))


def test_stale_files_are_swept_when_a_probe_starts(tmp_path: Path) -> None:
    mine = tmp_path / f"{os.getpid()}-{recorder.start_ticks()}.probe"
    dead = tmp_path / f"1-{recorder.start_ticks(1) + 1}.probe"  # pid 1, but another start
    other = tmp_path / "notes.txt"
    for f in (mine, dead, other):
        f.write_bytes(b"x")
    recorder._sweep(str(tmp_path))
    assert mine.exists() and other.exists() and not dead.exists()


def test_a_fifo_at_a_probe_name_does_not_hang_the_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "4242-1.probe"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            layout.read_consistent(fifo)
        except BaseException as exc:
            done.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the reader blocked on a FIFO"
    assert isinstance(done[0], layout.ProbeFileError)


def test_a_symlink_at_a_probe_name_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"\0" * FILE_SIZE)
    link = tmp_path / "4242-1.probe"
    link.symlink_to(target)
    with pytest.raises(OSError):
        layout.read_consistent(link)


def test_gpubox_run_runs_a_script_without_a_shebang_with_sh(tmp_path: Path) -> None:
    script = tmp_path / "plain.sh"
    script.write_text('echo ran-by-sh "$1"\nexit 4\n')
    script.chmod(0o755)
    res = subprocess.run(
        [sys.executable, "-m", "gpubox", "run", str(script), "arg"], capture_output=True, text=True, timeout=60
    )
    assert res.stdout.strip() == "ran-by-sh arg"
    assert res.returncode == 4


def test_a_batch_that_came_within_one_clock_tick_ends_the_wait(tmp_path: Path) -> None:
    # A coarse clock (a VM's jiffies clocksource) reads the same before and after a quick batch:
    # the process must not be left marked as waiting, or it reads 100% from then on.
    program = """
from pathlib import Path
from gpubox.probe import layout, recorder
recorder.prepare()
recorder.monotonic_ns = lambda: 5_000_000_000
recorder.end(recorder.begin(), True)
record = layout.read_consistent(Path(recorder._path))
print(record.batches, record.waiting_since_ns, record.window(7_000_000_000, 10)[0])
"""
    env = {**os.environ, "GPUBOX_RUNTIME_DIR": str(tmp_path / "runtime")}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "0", "0.0"]
