"""The queue job of a GPU process, read from /proc/<pid>/environ, and cached per process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox import format as fmt
from gpubox.telemetry import host_procs, job_tags
from gpubox.telemetry.host_procs import PidTable
from gpubox.telemetry.job_tags import NO_JOB, JobTag, parse_environ, read_job_tag


def environ(*entries: str) -> bytes:
    return b"".join(e.encode() + b"\0" for e in entries)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (environ("HOME=/root", "GPUBOX_JOB_ID=12", "GPUBOX_JOB_KIND=train", "PATH=/bin"), JobTag(12, "train")),
        (environ("GPUBOX_JOB_KIND=quantize", "GPUBOX_JOB_ID=3"), JobTag(3, "quantize")),
        # the last entry without its NUL, as a truncated read would leave it
        (b"GPUBOX_JOB_ID=5\0GPUBOX_JOB_KIND=batch", JobTag(5, "batch")),
        # set twice: the first counts, as getenv() reads it
        (environ("GPUBOX_JOB_ID=4", "GPUBOX_JOB_KIND=infer", "GPUBOX_JOB_ID=9"), JobTag(4, "infer")),
    ],
)
def test_a_job_in_the_environment(data: bytes, expected: JobTag) -> None:
    assert parse_environ(data) == expected


@pytest.mark.parametrize(
    "data",
    [
        b"",
        environ("HOME=/root", "PATH=/bin"),
        environ("GPUBOX_JOB_ID=12"),  # no kind
        environ("GPUBOX_JOB_KIND=train"),  # no id
        environ("GPUBOX_JOB_ID=0", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=-3", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=+3", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID= 3", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=1_000", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=12a", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=", "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=١٢", "GPUBOX_JOB_KIND=train"),  # digits, but not ASCII ones
        environ("GPUBOX_JOB_ID=" + "9" * 5000, "GPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID=12", "GPUBOX_JOB_KIND=training"),
        environ("GPUBOX_JOB_ID=12", "GPUBOX_JOB_KIND=Train"),
        environ("GPUBOX_JOB_ID=12", "GPUBOX_JOB_KIND="),
        b"GPUBOX_JOB_ID=12\0GPUBOX_JOB_KIND=tr\xffin\0",
        environ("XGPUBOX_JOB_ID=12", "XGPUBOX_JOB_KIND=train"),
        environ("GPUBOX_JOB_ID_OLD=12", "GPUBOX_JOB_KIND_OLD=train"),
    ],
)
def test_no_job_or_a_malformed_one_is_no_job(data: bytes) -> None:
    assert parse_environ(data) == NO_JOB


def fake_proc(root: Path, pid: int, data: bytes) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "environ").write_bytes(data)


def test_read_from_a_proc_root(tmp_path: Path) -> None:
    fake_proc(tmp_path, 41, environ("GPUBOX_JOB_ID=41", "GPUBOX_JOB_KIND=other"))
    fake_proc(tmp_path, 42, environ("HOME=/home/alice"))
    assert read_job_tag(41, str(tmp_path)) == JobTag(41, "other")
    assert read_job_tag(42, str(tmp_path)) == NO_JOB
    # gone: not a job, and not known to be none either
    assert read_job_tag(43, str(tmp_path)) == JobTag(reason="no_process")


def test_another_users_process_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_proc(tmp_path, 41, environ("GPUBOX_JOB_ID=41", "GPUBOX_JOB_KIND=other"))

    def denied(path: str, mode: str = "r") -> Any:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(job_tags, "open", denied, raising=False)
    assert read_job_tag(41, str(tmp_path)) == JobTag(reason="no_permission")


@pytest.fixture
def job_child() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "GPUBOX_JOB_ID": "7", "GPUBOX_JOB_KIND": "train"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def test_a_real_process_started_as_a_job(job_child: subprocess.Popen[bytes]) -> None:
    assert read_job_tag(job_child.pid) == JobTag(7, "train")
    info = PidTable().lookup([job_child.pid])[job_child.pid]
    assert (info.job_id, info.job_kind) == (7, "train")
    assert "job_id" not in info.reasons and "job_kind" not in info.reasons


def test_a_real_process_without_a_job() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_JOB_")}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        info = PidTable().lookup([proc.pid])[proc.pid]
        assert (info.job_id, info.job_kind) == (None, None)
        assert "job_id" not in info.reasons  # known to be no job, not unknown
    finally:
        proc.kill()
        proc.wait()


class CountingReads:
    def __init__(self, tag: JobTag) -> None:
        self.tag = tag
        self.pids: list[int] = []

    def __call__(self, pid: int) -> JobTag:
        self.pids.append(pid)
        return self.tag


def test_environ_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = {101: 5000, 102: 6000}
    monkeypatch.setattr(host_procs, "read_proc_stat", lambda pid: (1.0, ticks[pid], 4096))
    monkeypatch.setattr(host_procs, "_identity", lambda pid: ("alice", "python train.py"))
    reads = CountingReads(JobTag(12, "train"))
    monkeypatch.setattr(host_procs, "read_job_tag", reads)
    table = PidTable(host_pids_visible=True)
    for _ in range(3):
        info = table.lookup([101, 102])
        assert (info[101].job_id, info[101].job_kind) == (12, "train")
    assert sorted(reads.pids) == [101, 102]
    # pid 101 now names another process (a new start time): its environment is read again
    ticks[101] = 7000
    table.lookup([101, 102])
    assert sorted(reads.pids) == [101, 101, 102]
    # a pid that left the GPUs is forgotten, and read afresh if it comes back
    table.lookup([101])
    table.lookup([101, 102])
    assert sorted(reads.pids) == [101, 101, 102, 102]


def test_an_unreadable_environment_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_procs, "read_proc_stat", lambda pid: (1.0, 5000, 4096))
    monkeypatch.setattr(host_procs, "_identity", lambda pid: ("bob", "python serve.py"))
    monkeypatch.setattr(host_procs, "read_job_tag", CountingReads(JobTag(reason="no_permission")))
    info = PidTable(host_pids_visible=True).lookup([101])[101]
    assert (info.job_id, info.job_kind) == (None, None)
    assert info.reasons["job_id"] == info.reasons["job_kind"] == "no_permission"


def test_pids_of_another_namespace_have_no_job() -> None:
    info = PidTable(host_pids_visible=False).lookup([os.getpid()])[os.getpid()]
    assert (info.job_id, info.job_kind) == (None, None) and info.reasons["job_id"] == "no_process"


def test_job_cell() -> None:
    assert fmt.job(12, "train") == "12 train"
    assert fmt.job(None, None) == fmt.DASH
