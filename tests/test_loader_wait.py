"""Reading loader wait: probe files (window math, damaged files, stale files, recycled pids),
finding another process's runtime directory, the stack-sampling tier, and the settings."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpubox.config import load_config
from gpubox.exit_codes import GpuboxError
from gpubox.paths import resolve_paths
from gpubox.probe import layout
from gpubox.telemetry.loader_wait import LoaderWaitReader, ProcView, wait_level

S = 1_000_000_000  # nanoseconds in a second


def probe_bytes(
    pid: int,
    start_ticks: int,
    *,
    buckets: Sequence[tuple[int, int, int]] = (),
    first_ns: int = 0,
    last_ns: int = 0,
    waiting_since_ns: int = 0,
    batches: int | None = None,
    wait_ns: int | None = None,
    seq: int = 2,
    magic: bytes = layout.MAGIC,
    version: int = layout.VERSION,
) -> bytes:
    """A probe file as the writer leaves it, with every slot of the layout filled by hand;
    `buckets` are (second, wait_ns, batches)."""
    words = [0] * layout.WORDS
    words[layout.S_VERSION] = version
    words[layout.S_PID] = pid
    words[layout.S_START_TICKS] = start_ticks
    words[layout.S_SEQ] = seq
    words[layout.S_BATCHES] = sum(b for _, _, b in buckets) if batches is None else batches
    words[layout.S_WAIT_NS] = sum(w for _, w, _ in buckets) if wait_ns is None else wait_ns
    words[layout.S_FIRST_NS] = first_ns
    words[layout.S_LAST_NS] = last_ns
    words[layout.S_LAST_WAIT_NS] = buckets[-1][1] // max(1, buckets[-1][2]) if buckets else 0
    words[layout.S_WAITING_SINCE_NS] = waiting_since_ns
    words[layout.S_BUCKET_COUNT] = layout.BUCKETS
    assert len(buckets) <= layout.BUCKETS
    for i, (second, wait, count) in enumerate(buckets):
        base = layout.S_BUCKETS + 3 * i
        words[base : base + 3] = [second, wait, count]
    data = bytearray(struct.pack(f"<{layout.WORDS}Q", *words))
    data[:8] = magic
    return bytes(data)


def write_probe(path: Path, pid: int, start_ticks: int, **fields: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(probe_bytes(pid, start_ticks, **fields))  # type: ignore[arg-type]
    return path


def steady_buckets(
    now_ns: int, wait_s: float, batches: int, seconds: int = layout.BUCKETS
) -> list[tuple[int, int, int]]:
    """`wait_s` of waiting and `batches` batches in each of the last `seconds` seconds up to now."""
    now_s = now_ns // S
    return [(s, int(wait_s * S), batches) for s in range(now_s - seconds + 1, now_s + 1)]


class FakeProc:
    """A /proc tree of our own: processes with the status, environ and namespaces we choose."""

    def __init__(self, root: Path) -> None:
        self.root = root / "proc"
        (self.root / "self" / "ns").mkdir(parents=True)
        os.symlink("mnt:[4026531832]", self.root / "self" / "ns" / "mnt")

    def add(
        self,
        pid: int,
        *,
        uid: int = 1000,
        ns_pid: int | None = None,
        env: dict[str, str] | None = None,
        mnt: str = "mnt:[4026531832]",
        uid_map: str | None = None,
    ) -> Path:
        base = self.root / str(pid)
        (base / "ns").mkdir(parents=True)
        nspid = f"{pid}" if ns_pid is None else f"{pid}\t{ns_pid}"
        (base / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t{nspid}\n")
        if env is not None:
            (base / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        os.symlink(mnt, base / "ns" / "mnt")
        if uid_map is not None:
            (base / "uid_map").write_text(uid_map)
        (base / "root").mkdir()
        return base


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def reader(proc: FakeProc, now_ns: int, window_s: int = 10, **kw: object) -> LoaderWaitReader:
    """A reader on the fake /proc; no stack sampling unless a test hands in a sampler."""
    kw.setdefault("sampler_factory", lambda window: None)
    return LoaderWaitReader(window_s=window_s, clock_ns=lambda: now_ns, proc=ProcView(proc.root), **kw)  # type: ignore[arg-type]


NOW = 5_000 * S + S // 2  # half way through second 5000 of CLOCK_MONOTONIC


def test_window_over_the_last_seconds(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 42, 777), 42, 777, buckets=steady_buckets(NOW, 0.3, 10), first_ns=NOW - 60 * S)
    reading = reader(proc, NOW).read({42: 777})
    got = reading.by_pid[42]
    # Seconds 4991..5000: 9.5 s of wall time, ten buckets of 0.3 s waiting and 10 batches each.
    assert got.source == "probe" and got.reason is None
    assert got.loader_wait == pytest.approx(3.0 / 9.5)
    assert got.batches_per_s == pytest.approx(100 / 9.5)
    assert reading.errors == () and reading.notices == ()
    short = reader(proc, NOW, window_s=3).read({42: 777}).by_pid[42]
    assert short.loader_wait == pytest.approx(0.9 / 2.5) and short.batches_per_s == pytest.approx(30 / 2.5)


def test_a_wait_in_progress_counts_up_to_now(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    # Busy for 8 s with no wait, then blocked for the last 1.5 s (since 4999.0).
    buckets = [(s, 0, 20) for s in range(4991, 4999)]
    write_probe(layout.probe_file(rt, 42, 7), 42, 7, buckets=buckets, first_ns=NOW - 60 * S, waiting_since_ns=4999 * S)
    got = reader(proc, NOW).read({42: 7}).by_pid[42]
    assert got.loader_wait == pytest.approx(1.5 / 9.5)
    assert got.batches_per_s == pytest.approx(160 / 9.5)


def test_a_young_process_is_measured_from_its_first_batch(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    buckets = [(4999, S // 2, 5), (5000, S // 4, 5)]
    write_probe(layout.probe_file(rt, 42, 7), 42, 7, buckets=buckets, first_ns=4998 * S + S // 2)
    got = reader(proc, NOW).read({42: 7}).by_pid[42]
    assert got.loader_wait == pytest.approx(0.75 / 2.0) and got.batches_per_s == pytest.approx(5.0)


def test_a_probe_with_no_batch_yet_says_so(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 42, 7), 42, 7)
    got = reader(proc, NOW).read({42: 7}).by_pid[42]
    assert got.loader_wait is None and got.reason == "no_batches_yet" and got.source is None


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"magic": b"NOTPROBE"}, "not a gpubox probe file"),
        ({"version": 9}, "probe layout version 9"),
        ({"seq": 3}, "in the middle of an update"),  # a writer that died mid-update: torn for good
        ({"truncate": 100}, "truncated (100 of 512 bytes)"),
        ({"truncate": 0}, "truncated (0 of 512 bytes)"),
    ],
)
def test_a_damaged_file_is_skipped_with_a_reason(
    proc: FakeProc, tmp_path: Path, damage: dict[str, object], message: str
) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    proc.add(43, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    path = layout.probe_file(rt, 42, 7)
    cut = damage.pop("truncate", None)
    write_probe(path, 42, 7, buckets=steady_buckets(NOW, 0.1, 5), first_ns=NOW - 60 * S, **damage)
    if isinstance(cut, int):
        path.write_bytes(path.read_bytes()[:cut])
    write_probe(layout.probe_file(rt, 43, 8), 43, 8, buckets=steady_buckets(NOW, 0.1, 5), first_ns=NOW - 60 * S)
    reading = reader(proc, NOW).read({42: 7, 43: 8})
    bad = reading.by_pid[42]
    assert bad.loader_wait is None and bad.source is None and bad.reason == "probe_unreadable"
    (error,) = reading.errors
    assert error.startswith(f"pid 42: probe file {path} skipped: ") and message in error
    assert reading.by_pid[43].loader_wait == pytest.approx(1.0 / 9.5)  # the others are read as ever


def test_a_file_torn_on_every_read_is_skipped(proc: FakeProc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer so busy that the sequence moves during every copy: the reader gives up."""
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 42, 7), 42, 7, buckets=steady_buckets(NOW, 0.1, 5), first_ns=1)
    real_pread = os.pread
    seq = iter(range(2, 10_000, 2))

    def moving_pread(fd: int, n: int, offset: int) -> bytes:
        if offset == 8 * layout.S_SEQ:  # every look at the sequence finds the writer further on
            return struct.pack("<Q", next(seq))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(layout.os, "pread", moving_pread)
    reading = reader(proc, NOW).read({42: 7})
    assert reading.by_pid[42].reason == "probe_unreadable"
    assert "changed while read" in reading.errors[0]


def test_a_stale_file_of_a_dead_process_is_never_read_as_another(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    fields = {"buckets": steady_buckets(NOW, 0.5, 5), "first_ns": NOW - 60 * S}
    # Pid 42 ran before, started at tick 100, and died without removing its file.
    write_probe(layout.probe_file(rt, 42, 100), 42, 100, **fields)
    # A file under this process's name whose figures say they belong to another process.
    write_probe(layout.probe_file(rt, 42, 200), 42, 100, **fields)
    read = reader(proc, NOW)
    got = read.read({42: 200}).by_pid[42]
    assert got.loader_wait is None and got.reason == "not_measured"
    write_probe(layout.probe_file(rt, 42, 200), 41, 200, **fields)  # right ticks, wrong pid
    got = read.read({42: 200}).by_pid[42]
    assert got.loader_wait is None and got.reason == "not_measured"


def test_a_recycled_pid_gets_its_own_figures(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 42, 100), 42, 100, buckets=steady_buckets(NOW, 0.5, 5), first_ns=1)
    read = reader(proc, NOW)
    assert read.read({42: 100}).by_pid[42].loader_wait == pytest.approx(5 / 9.5)
    # Same pid, started later: the old process's file is left alone.
    assert read.read({42: 300}).by_pid[42].reason == "not_measured"
    write_probe(layout.probe_file(rt, 42, 300), 42, 300, buckets=steady_buckets(NOW, 0.1, 5), first_ns=1)
    assert read.read({42: 300}).by_pid[42].loader_wait == pytest.approx(1 / 9.5)


def test_a_file_that_appears_later_is_found(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    read = reader(proc, NOW)
    assert read.read({42: 7}).by_pid[42].reason == "not_measured"
    write_probe(layout.probe_file(rt, 42, 7), 42, 7, buckets=steady_buckets(NOW, 0.2, 5), first_ns=1)
    assert read.read({42: 7}).by_pid[42].source == "probe"
    layout.probe_file(rt, 42, 7).unlink()  # the process exited and removed it
    assert read.read({42: 7}).by_pid[42].reason == "not_measured"


def test_a_pid_not_in_proc_is_not_measured(proc: FakeProc) -> None:
    got = reader(proc, NOW).read({99: 7}).by_pid[99]
    assert got.loader_wait is None and got.reason == "not_measured"


# -- where another process keeps its probe file ------------------------------------------------


def test_runtime_dir_from_the_process_environment(proc: FakeProc, tmp_path: Path) -> None:
    view = ProcView(proc.root)
    proc.add(10, uid=1000, env={"XDG_RUNTIME_DIR": "/run/user/1000", "HOME": "/home/a"})
    assert view.locate(10, 5).candidates == (Path("/run/user/1000/gpubox/probe/10-5.probe"),)
    proc.add(11, uid=1000, env={"XDG_RUNTIME_DIR": "/x", "GPUBOX_RUNTIME_DIR": "/override"})
    assert view.locate(11, 5).candidates == (Path("/override/probe/11-5.probe"),)
    # A cron job: no XDG_RUNTIME_DIR; the process resolved it as resolve_paths does for its uid.
    proc.add(12, uid=54321, env={"HOME": "/home/b"})
    expected = resolve_paths({"HOME": "/home/b"}, 54321).runtime_dir / "probe" / "12-5.probe"
    assert view.locate(12, 5).candidates == (expected,)
    assert expected == Path("/tmp/gpubox-54321/probe/12-5.probe")
    # A relative GPUBOX_RUNTIME_DIR is relative to the process's working directory.
    proc.add(13, env={"GPUBOX_RUNTIME_DIR": "rt"})
    assert view.locate(13, 5).candidates == (proc.root / "13" / "cwd" / "rt" / "probe" / "13-5.probe",)


def test_unreadable_environment_falls_back_to_the_owners_home(proc: FakeProc) -> None:
    base = proc.add(20, uid=54322)  # no environ file: as for another user's process
    assert not (base / "environ").exists()
    expected = resolve_paths({"HOME": "/"}, 54322).runtime_dir
    assert ProcView(proc.root).locate(20, 5).candidates == (expected / "probe" / "20-5.probe",)


def test_a_process_in_a_container_is_read_through_its_root(proc: FakeProc, tmp_path: Path) -> None:
    # Another mount and PID namespace: pid 31 here is pid 7 in there, and uid 100000 here is
    # root in there (a user namespace).
    base = proc.add(31, uid=100000, ns_pid=7, env={"HOME": "/root"}, mnt="mnt:[4026532999]", uid_map="0 100000 65536\n")
    view = ProcView(proc.root)
    location = view.locate(31, 5)
    assert location.ns_pid == 7
    root = base / "root"
    assert location.candidates[0] == root / str(resolve_paths({"HOME": "/root"}, 0).runtime_dir)[1:] / "probe/7-5.probe"
    assert set(location.candidates) >= {
        root / "run/user/0/gpubox/probe/7-5.probe",
        root / "tmp/gpubox-0/probe/7-5.probe",
    }
    write_probe(root / "tmp/gpubox-0/probe/7-5.probe", 7, 5, buckets=steady_buckets(NOW, 0.4, 5), first_ns=1)
    got = reader(proc, NOW).read({31: 5}).by_pid[31]
    assert got.source == "probe" and got.loader_wait == pytest.approx(4 / 9.5)
    # The file must name the pid the process sees: one with the host pid is another's.
    write_probe(root / "tmp/gpubox-0/probe/7-5.probe", 31, 5, buckets=steady_buckets(NOW, 0.4, 5), first_ns=1)
    assert reader(proc, NOW).read({31: 5}).by_pid[31].reason == "not_measured"


def test_a_container_with_an_explicit_runtime_dir(proc: FakeProc) -> None:
    base = proc.add(32, env={"XDG_RUNTIME_DIR": "/run/user/1000"}, mnt="mnt:[4026532999]")
    assert ProcView(proc.root).locate(32, 5).candidates == (base / "root/run/user/1000/gpubox/probe/32-5.probe",)


# -- the stack-sampling tier --------------------------------------------------------------------


@dataclass(frozen=True)
class Sampled:
    fraction: float | None
    samples: int
    reason: str | None


class FakeSampler:
    def __init__(self, results: dict[int, Sampled], hint: str | None = None) -> None:
        self.results = results
        self.permission_hint = hint
        self.asked: list[list[int]] = []
        self.closed = False

    def update(self, pids: Iterable[int]) -> None:
        self.asked.append(list(pids))

    def result(self, pid: int) -> Sampled | None:
        return self.results.get(pid)

    def close(self) -> None:
        self.closed = True


def test_processes_without_a_probe_are_sampled(proc: FakeProc, tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    for pid in (40, 41, 42, 43):
        proc.add(pid, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 40, 1), 40, 1, buckets=steady_buckets(NOW, 0.2, 5), first_ns=1)
    sampler = FakeSampler(
        {41: Sampled(0.35, 20, None), 42: Sampled(None, 0, "no_permission")},
        hint="allow ptrace: run as root, or sudo sysctl kernel.yama.ptrace_scope=0",
    )
    windows: list[float] = []

    def factory(window: float) -> FakeSampler:
        windows.append(window)
        return sampler

    read = reader(proc, NOW, window_s=8, sampler_factory=factory)
    reading = read.read({40: 1, 41: 1, 42: 1, 43: 1})
    assert windows == [8.0] and sampler.asked == [[41, 42, 43]]  # the probed process is not sampled
    w = reading.by_pid
    assert w[40].source == "probe"
    assert (w[41].loader_wait, w[41].source, w[41].samples) == (0.35, "sampled", 20)
    assert w[42].loader_wait is None and w[42].reason == "no_permission"
    assert w[43].loader_wait is None and w[43].reason == "warming_up"  # no samples yet
    assert reading.notices == ("allow ptrace: run as root, or sudo sysctl kernel.yama.ptrace_scope=0",)
    read.close()
    assert sampler.closed


def test_no_sampler_is_started_when_every_process_has_a_probe_or_sampling_is_off(
    proc: FakeProc, tmp_path: Path
) -> None:
    rt = tmp_path / "rt"
    proc.add(40, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    proc.add(41, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    write_probe(layout.probe_file(rt, 40, 1), 40, 1, buckets=steady_buckets(NOW, 0.2, 5), first_ns=1)
    started: list[float] = []

    def factory(window: float) -> FakeSampler:
        started.append(window)
        return FakeSampler({})

    reader(proc, NOW, sampler_factory=factory).read({40: 1})
    assert started == []
    off = reader(proc, NOW, sampling=False, sampler_factory=factory).read({40: 1, 41: 1})
    assert started == [] and off.by_pid[41].reason == "not_measured"
    # py-spy missing: asked once, then unknown without asking again every refresh.
    calls: list[float] = []

    def missing(window: float) -> None:
        calls.append(window)

    read = reader(proc, NOW, sampler_factory=missing)
    for _ in range(3):
        assert read.read({41: 1}).by_pid[41].reason == "not_measured"
    assert len(calls) == 1


# -- levels and settings --------------------------------------------------------------------


def test_wait_levels() -> None:
    assert wait_level(None, 0.2) is None
    assert wait_level(0.2, 0.2) is None
    assert wait_level(0.21, 0.2) == "high"
    assert wait_level(0.41, 0.2) == "severe"
    assert wait_level(0.7, 0.6) == "high" and wait_level(1.0, 0.6) == "severe"
    assert wait_level(0.01, 0.0) == "severe"


def test_loader_settings(tmp_path: Path) -> None:
    paths = resolve_paths({"HOME": str(tmp_path), "GPUBOX_SYSTEM_CONFIG": str(tmp_path / "none.toml")})
    cfg = load_config({}, {}, paths)
    assert cfg.get("top.loader_window") == 10
    assert cfg.get("top.loader_wait_threshold") == 0.2
    assert cfg.get("top.loader_sampling") is True
    env = {
        "GPUBOX_TOP_LOADER_WINDOW": "5",
        "GPUBOX_TOP_LOADER_WAIT_THRESHOLD": "0.35",
        "GPUBOX_TOP_LOADER_SAMPLING": "0",
    }
    cfg = load_config({}, env, paths)
    assert (cfg.get("top.loader_window"), cfg.get("top.loader_wait_threshold")) == (5, 0.35)
    assert cfg.get("top.loader_sampling") is False
    for key, bad in (
        ("LOADER_WINDOW", "16"),
        ("LOADER_WINDOW", "2.5"),
        ("LOADER_WINDOW", "0"),
        ("LOADER_WAIT_THRESHOLD", "20"),
    ):
        with pytest.raises(GpuboxError) as err:
            load_config({}, {f"GPUBOX_TOP_{key}": bad}, paths)
        assert f"GPUBOX_TOP_{key}" in err.value.message


def test_a_wait_that_began_after_the_readers_clock_is_never_negative(proc: FakeProc, tmp_path: Path) -> None:
    # The training process began to wait a moment after the reader took the time (it reads
    # several files in turn), or a damaged file holds a start in the future: nothing of that
    # wait lies in the window, and the figure is never below 0.
    rt = tmp_path / "rt"
    proc.add(42, env={"GPUBOX_RUNTIME_DIR": str(rt)})
    buckets = [(s, 0, 20) for s in range(4991, 5001)]
    for since in (NOW + 50_000, NOW + 3600 * S):
        write_probe(layout.probe_file(rt, 42, 7), 42, 7, buckets=buckets, first_ns=NOW - 60 * S, waiting_since_ns=since)
        got = reader(proc, NOW).read({42: 7}).by_pid[42]
        assert got.source == "probe" and got.loader_wait == 0.0
