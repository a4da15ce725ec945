"""`doctor --data`: the sample of files, cold and warm reads, the verdicts (from injected
measurements and thresholds, never from this machine's speed), and the filesystem from a fake
mountinfo that names nfs4 and fuse.sshfs mounts."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from gpubox.doctor.data_checks import (
    DataPathError,
    ReadMeasurement,
    data_checks,
    drop_cached,
    measure_reads,
    read_check,
    sample_files,
)
from gpubox.doctor.data_fs import Mount, filesystem_check, mount_of, parse_mountinfo
from gpubox.doctor.host_view import HostView
from gpubox.doctor.thresholds import Thresholds
from gpubox.exit_codes import ExitCode, GpuboxError
from tests.doctor.host_tree import HostTree, tmpfs

T = Thresholds()
MB = 1_000_000


def make_dataset(root: Path, files: int = 20, size: int = 64 * 1024) -> Path:
    for i in range(files):
        shard = root / f"shard{i % 3}"
        shard.mkdir(parents=True, exist_ok=True)
        (shard / f"{i:05d}.bin").write_bytes(os.urandom(size))
    return root


def mountinfo_line(mid: int, point: str, fstype: str, source: str) -> str:
    return f"{mid} 1 0:{mid} / {point} rw,relatime shared:{mid} - {fstype} {source} rw"


# --- the sample --------------------------------------------------------------------------------


def test_sample_is_bounded_and_the_same_every_time(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", files=30)
    (data / ".cache").mkdir()
    (data / ".cache" / "lock").write_bytes(b"x")
    (data / "empty.bin").write_bytes(b"")
    first = sample_files(data, max_files=7)
    assert first == sample_files(data, max_files=7) and len(first) == 7
    assert all(p.stat().st_size > 0 and ".cache" not in p.parts for p in first)
    assert len({p.parent.name for p in first}) == 3  # spread over the tree, not the first folder only
    assert sample_files(data / "shard0" / "00000.bin") == (data / "shard0" / "00000.bin",)


def test_nothing_to_read_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(DataPathError, match="does not exist") as missing:
        sample_files(tmp_path / "nope")
    assert isinstance(missing.value, GpuboxError) and missing.value.code == ExitCode.USAGE
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "zero.bin").write_bytes(b"")
    with pytest.raises(DataPathError, match="no readable, non-empty files under"):
        data_checks(empty, T)


# --- reading -----------------------------------------------------------------------------------


def test_reads_are_measured_and_bounded(tmp_path: Path) -> None:
    files = sample_files(make_dataset(tmp_path / "data", files=8, size=3 * 1024 * 1024))
    m = measure_reads(files, max_bytes=8 * 1024 * 1024)
    assert m.files == m.sampled == 8 and m.cold_bytes == m.warm_bytes == 8 * 1024 * 1024  # 1 MiB of each file
    assert m.cold_MBps is not None and m.cold_MBps > 0 and m.warm_MBps is not None and m.warm_MBps > 0
    assert m.files_per_s is not None and m.files_per_s > 0


def test_time_bound_stops_the_cold_pass(tmp_path: Path) -> None:
    files = sample_files(make_dataset(tmp_path / "data", files=10))
    ticks = itertools.count(step=4.0)
    m = measure_reads(files, max_seconds=10.0, clock=lambda: float(next(ticks)))
    assert m.stopped_early and m.files < m.sampled
    assert "reading stopped after" in read_check(m, T).meaning


def test_drop_cached_on_a_local_disk(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", files=1, size=1024 * 1024)
    path = next(data.rglob("*.bin"))
    mount = mount_of(path, Path("/proc/self/mountinfo"))
    if mount is None or mount.kind != "local":
        pytest.skip(f"the temporary folder is not on a local disk here ({mount})")
    path.read_bytes()
    result = drop_cached(path, 1024 * 1024)
    assert result is not None, "root or the owner may see the page cache"
    cached, pages = result
    assert pages == 1024 * 1024 // os.sysconf("SC_PAGE_SIZE") and cached < pages


def test_tmpfs_keeps_its_pages_and_the_check_says_so(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ram", 16) as ram:
        files = sample_files(make_dataset(ram / "data", files=4))
        m = measure_reads(files)
        mount = mount_of(ram, Path("/proc/self/mountinfo"))
    assert m.cached_fraction == 1.0 and mount is not None and mount.fstype == "tmpfs"
    check = read_check(m, Thresholds(data_warn_MBps=1e-6), mount)
    assert check.status == "ok" and "kept 100% of the pages cached despite the drop (tmpfs)" in check.meaning


# --- verdicts from injected measurements --------------------------------------------------------


def measured(cold_MBps: float, warm_MBps: float, cached: float | None = 0.0) -> ReadMeasurement:
    return ReadMeasurement(
        files=64,
        cold_bytes=100 * MB,
        cold_seconds=100 / cold_MBps,
        warm_bytes=100 * MB,
        warm_seconds=100 / warm_MBps,
        cached_fraction=cached,
        sampled=64,
    )


def test_slow_cold_reads_warn() -> None:
    check = read_check(measured(50, 3000), T)
    assert check.status == "warn" and check.unit == "MB/s"
    assert check.value == {"cold_MBps": pytest.approx(50), "warm_MBps": pytest.approx(3000)}
    assert check.detail == "cold 50 MB/s, warm 3000 MB/s over 64 files (95.4MiB)"
    assert "local NVMe" in (check.fix or "") and "WebDataset" in (check.fix or "")
    assert check.impact == pytest.approx(0.6)


def test_slow_even_when_cached() -> None:
    check = read_check(measured(50, 80), T)
    assert check.status == "warn" and "Even cached reads are slow" in check.meaning


def test_fast_reads_pass_and_thresholds_decide() -> None:
    assert read_check(measured(900, 5000), T).status == "ok"
    assert read_check(measured(900, 5000), Thresholds(data_warn_MBps=1000)).status == "warn"


def test_unknown_page_cache_is_said() -> None:
    check = read_check(measured(900, 5000, cached=None), T)
    assert "'cold' may be warm" in check.meaning


# --- filesystems -------------------------------------------------------------------------------


def test_mountinfo_longest_match_and_escapes(tmp_path: Path) -> None:
    tree = HostTree(tmp_path / "host")
    tree.mountinfo(
        [
            mountinfo_line(20, "/", "ext4", "/dev/nvme0n1p2"),
            mountinfo_line(21, "/mnt/data", "nfs4", "filer:/export/data"),
            mountinfo_line(22, "/mnt/data/scratch", "tmpfs", "tmpfs"),
            mountinfo_line(23, "/mnt/remote", "fuse.sshfs", "me@host:/srv"),
            mountinfo_line(24, r"/mnt/my\040data", "cifs", "//nas/share"),
            mountinfo_line(25, "/mnt/remote", "fuse.gcsfuse", "bucket"),  # mounted over the sshfs one
            "garbage line",
        ]
    )
    mountinfo = tree.proc / "self" / "mountinfo"
    assert len(parse_mountinfo(mountinfo.read_text())) == 6
    kinds = {
        "/mnt/data/imagenet": "nfs4",
        "/mnt/data/scratch/x": "tmpfs",
        "/mnt/database": "ext4",  # a sibling, not inside /mnt/data
        "/mnt/my data/x": "cifs",
        "/mnt/remote/x": "fuse.gcsfuse",
    }
    for path, fstype in kinds.items():
        found = mount_of(Path(path), mountinfo)
        assert found is not None and found.fstype == fstype, path
    assert mount_of(Path("/x"), tmp_path / "no-mountinfo") is None


@pytest.mark.parametrize(
    ("fstype", "kind", "status"),
    [
        ("nfs4", "network", "warn"),
        ("cifs", "network", "warn"),
        ("9p", "network", "warn"),
        ("ceph", "network", "warn"),
        ("lustre", "parallel", "warn"),
        ("gpfs", "parallel", "warn"),
        ("beegfs", "parallel", "warn"),
        ("fuse.sshfs", "fuse", "warn"),
        ("fuse.s3fs", "fuse", "warn"),
        ("fuse", "fuse", "warn"),
        ("virtiofs", "vm-share", "warn"),
        ("ext4", "local", "ok"),
        ("xfs", "local", "ok"),
        ("overlay", "local", "ok"),
        ("tmpfs", "memory", "ok"),
    ],
)
def test_filesystem_kinds(fstype: str, kind: str, status: str) -> None:
    mount = Mount("/mnt/x", fstype, "src")
    check = filesystem_check(Path("/mnt/x/data"), mount)
    assert (mount.kind, check.status, check.value) == (kind, status, fstype)
    if status == "warn":
        assert check.fix and check.impact > 0 and check.meaning
        halved = filesystem_check(Path("/mnt/x/data"), mount, read_ok=True)
        assert halved.impact == pytest.approx(check.impact / 2)
    assert check.evidence["kind"] == kind


def test_filesystem_unknown_skips() -> None:
    assert filesystem_check(Path("/x"), None).status == "skip"


@pytest.mark.parametrize(("fstype", "source"), [("nfs4", "filer:/export"), ("fuse.sshfs", "me@host:/srv")])
def test_data_checks_on_a_network_mount(tmp_path: Path, fstype: str, source: str) -> None:
    data = make_dataset(tmp_path / "mnt" / "data")
    tree = HostTree(tmp_path / "host")
    real = os.path.realpath(tmp_path / "mnt")
    tree.mountinfo([mountinfo_line(20, "/", "ext4", "/dev/vda"), mountinfo_line(21, real, fstype, source)])
    view = HostView(proc=tree.proc)
    read, fs = data_checks(data, Thresholds(data_warn_MBps=1e-6), view)
    assert (read.id, read.status, fs.id, fs.status) == ("data.read", "ok", "data.filesystem", "warn")
    assert read.value["cold_MBps"] > 0 and read.value["warm_MBps"] > 0
    assert fs.value == fstype and source in fs.detail and "local NVMe" in (fs.fix or "")
    slow, fs_slow = data_checks(data, Thresholds(data_warn_MBps=1e12), view, max_files=3)
    assert slow.status == "warn" and slow.evidence["files"] == 3 and fs_slow.impact == pytest.approx(2 * fs.impact)
