"""Loader wait through `gpubox top --once`, with the fake NVML listing real child processes
whose probe files the tests write by hand; and a probe file that only another mount namespace
can see, found through /proc/<pid>/root."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubox.probe import layout
from gpubox.telemetry.host_procs import read_proc_stat
from gpubox.telemetry.loader_wait import LoaderWaitReader
from gpubox.telemetry.model import BoxSnapshot
from gpubox.telemetry.nvml_backend import NvmlBackend
from gpubox.telemetry.simulated import SimulatedBackend
from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import REPO, run_gpubox
from tests.test_loader_wait import FakeSampler, S, Sampled, probe_bytes, write_probe

SLEEPER = "import time; time.sleep(120)"


def live_buckets(wait_s: float, batches: int) -> dict[str, object]:
    """Figures as of now on CLOCK_MONOTONIC (shared by every process): `wait_s` of waiting and
    `batches` batches in each second, from 10 s ago to 5 s ahead (slack for start-up)."""
    now_s = time.monotonic_ns() // S
    buckets = [(s, int(wait_s * S), batches) for s in range(now_s - 10, now_s + 6)]
    return {"buckets": buckets, "first_ns": (now_s - 60) * S}


@pytest.fixture
def children(tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path]]:
    """Four sleeping Python processes whose runtime directory is tmp/rt (set in their environment,
    not in gpubox's)."""
    rt = tmp_path / "rt"
    env = dict(os.environ, GPUBOX_RUNTIME_DIR=str(rt))
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER], env=env) for _ in range(4)]
    try:
        yield procs, rt
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_top_once_reads_the_probe_files_of_gpu_processes(
    tmp_path: Path, children: tuple[list[subprocess.Popen[bytes]], Path]
) -> None:
    procs, rt = children
    good, plain, corrupt, stale = (p.pid for p in procs)
    ticks = {p.pid: read_proc_stat(p.pid)[1] for p in procs}
    write_probe(layout.probe_file(rt, good, ticks[good]), good, ticks[good], **live_buckets(0.25, 10))
    bad_path = write_probe(layout.probe_file(rt, corrupt, ticks[corrupt]), corrupt, ticks[corrupt], magic=b"XXXXXXXX")
    # left by an earlier process that had the same pid
    write_probe(layout.probe_file(rt, stale, ticks[stale] - 1), stale, ticks[stale] - 1, **live_buckets(0.9, 1))
    box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=4), [good, plain, corrupt, stale])
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"))
    env["GPUBOX_TOP_LOADER_SAMPLING"] = "false"  # only the probe tier here
    env["GPUBOX_RUNTIME_DIR"] = str(tmp_path / "gpubox-own")  # gpubox's own does not matter
    res = run_gpubox("top", "--once", "--json", "--interval", "0.05", env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    procs_by_pid = {p["pid"]: p for p in doc["data"]["processes"]}
    p = procs_by_pid[good]
    # ten (or at the edge of a second eleven) 0.25 s waits over 9 to 10 s of wall time
    assert p["loader_wait_source"] == "probe" and 0.24 <= p["loader_wait"] <= 0.31, p
    assert 9.0 <= p["batches_per_s"] <= 12.3 and "loader_wait" not in p["reasons"]
    assert p["loader_wait_samples"] is None
    for pid in (plain, stale):
        q = procs_by_pid[pid]
        assert q["loader_wait"] is None and q["loader_wait_source"] is None and q["batches_per_s"] is None
        assert q["reasons"]["loader_wait"] == "not_measured"
    c = procs_by_pid[corrupt]
    assert c["loader_wait"] is None and c["reasons"]["loader_wait"] == "probe_unreadable"
    assert f"pid {corrupt}: probe file {bad_path} skipped: not a gpubox probe file" in doc["errors"]
    assert doc["data"]["notices"] == []

    table = run_gpubox("top", "--once", "--no-color", "--interval", "0.05", env=env)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.lstrip().startswith(str(good)))
    assert "% probe" in row


def test_the_window_setting_reaches_the_reader(
    tmp_path: Path, children: tuple[list[subprocess.Popen[bytes]], Path]
) -> None:
    procs, rt = children
    pid = procs[0].pid
    ticks = read_proc_stat(pid)[1]
    now_s = time.monotonic_ns() // S
    # Waiting only in the seconds 6 to 10 ago: a 5 s window sees none of it, a 10 s one half.
    buckets = [(s, S if s <= now_s - 6 else 0, 4) for s in range(now_s - 10, now_s + 6)]
    write_probe(layout.probe_file(rt, pid, ticks), pid, ticks, buckets=buckets, first_ns=(now_s - 60) * S)
    box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=1), [pid])
    env = fake_nvml_env(box.write(tmp_path / "scenario.txt"))
    figures = {}
    for window in ("5", "10"):
        env["GPUBOX_TOP_LOADER_WINDOW"] = window
        res = run_gpubox("top", "--once", "--json", "--interval", "0.05", env=env)
        assert res.returncode == 0, res.stderr
        figures[window] = json.loads(res.stdout)["data"]["processes"][0]["loader_wait"]
    assert figures["5"] == 0.0
    assert 0.2 < figures["10"] <= 0.56  # 3 to 5 of the waiting seconds, as the clock turns


CHILD_IN_NAMESPACE = r"""
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from tests.test_loader_wait import S, probe_bytes
hidden, rt = sys.argv[2], sys.argv[3]
subprocess.run(["mount", "-t", "tmpfs", "none", hidden], check=True)
with open("/proc/self/stat", "rb") as fh:
    ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
now_s = time.monotonic_ns() // S
buckets = [(s, S // 2, 3) for s in range(now_s - 10, now_s + 6)]
os.makedirs(os.path.join(rt, "probe"))
name = os.path.join(rt, "probe", f"{os.getpid()}-{ticks}.probe")
with open(name, "wb") as fh:
    fh.write(probe_bytes(os.getpid(), ticks, buckets=buckets, first_ns=(now_s - 60) * S))
print(os.getpid(), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("pid_namespace", [False, True])
def test_a_probe_file_only_a_container_can_see(tmp_path: Path, pid_namespace: bool) -> None:
    """A process in its own mount namespace (and PID namespace) writes its probe file into a
    tmpfs that only it can see; the reader gets there through /proc/<pid>/root."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to make a mount namespace")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    rt = hidden / "rt"
    flags = ["--mount", "--propagation", "private", *(["--pid", "--fork"] if pid_namespace else [])]
    cmd = ["unshare", *flags, sys.executable, "-c", CHILD_IN_NAMESPACE, str(REPO), str(hidden), str(rt)]
    env = dict(os.environ, GPUBOX_RUNTIME_DIR=str(rt))
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid: int | None = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            pytest.skip(f"cannot make a namespace here: {child.communicate(timeout=10)[1].decode()[-300:]}")
        inner_pid = int(line)
        pid = child.pid
        if pid_namespace:  # unshare forked: the Python process is its child
            pid = int(Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()[0])
            assert inner_pid == 1
        else:
            assert inner_pid == pid
        assert not rt.exists()  # not from here: only inside its namespace
        reader = LoaderWaitReader(sampling=False)
        got = reader.read({pid: read_proc_stat(pid)[1]}).by_pid[pid]
        assert got.source == "probe", got
        assert got.loader_wait is not None and 0.49 <= got.loader_wait <= 0.56
    finally:
        if pid is not None and pid != child.pid:
            os.kill(pid, signal.SIGKILL)  # the namespace's first process outlives unshare
        child.kill()
        child.communicate(timeout=10)


def test_probe_bytes_is_a_file_the_layout_reads() -> None:
    rec = layout.parse(probe_bytes(5, 6, buckets=[(10, 3, 4)], first_ns=9))
    assert (rec.pid, rec.start_ticks, rec.batches, rec.wait_ns, rec.first_ns, rec.buckets) == (
        5,
        6,
        4,
        3,
        9,
        ((10, 3, 4),),
    )


def test_the_samplers_hint_reaches_the_snapshot(nvml: Any) -> None:
    """A GPU process without a probe goes to the stack sampler; its figure and its advice on
    ptrace come out in the NVML backend's snapshot."""
    child = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=1), [child.pid])
        sampler = FakeSampler({child.pid: Sampled(0.3, 12, None)}, hint="stack sampling needs ptrace")
        reader = LoaderWaitReader(sampler_factory=lambda window: sampler)
        backend = NvmlBackend(nvml(box), clock=lambda: 1000.0, loader_wait=reader)
        snap = backend.sample()
        (proc,) = snap.processes
        assert (proc.loader_wait, proc.loader_wait_source, proc.loader_wait_samples) == (0.3, "sampled", 12)
        assert proc.batches_per_s is None and "loader_wait" not in proc.reasons
        assert snap.notices == ("stack sampling needs ptrace",)
        assert sampler.asked == [[child.pid]]
        backend.close()
        assert sampler.closed
    finally:
        child.kill()
        child.wait()


def test_once_prints_a_notice_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpubox.cli.main import main

    real_sample = SimulatedBackend.sample

    def with_notice(self: SimulatedBackend) -> BoxSnapshot:
        return dataclasses.replace(real_sample(self), notices=("stack sampling needs ptrace",))

    monkeypatch.setattr(SimulatedBackend, "sample", with_notice)
    assert main(["top", "--once", "--json", "--demo", "--interval", "0.05"]) == 0
    out, err = capsys.readouterr()
    assert err == "gpubox: stack sampling needs ptrace\n"
    assert json.loads(out)["data"]["notices"] == ["stack sampling needs ptrace"]
