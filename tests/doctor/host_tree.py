"""A fake /proc, /sys and cgroup tree in a temporary folder, and a HostView that reads it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from gpubox.doctor.host_view import HostView

MiB = 1024 * 1024


def fake_statvfs(size_bytes: int, free_bytes: int | None = None, flag: int = 0) -> Callable[[str], os.statvfs_result]:
    """A statvfs that reports a filesystem of `size_bytes` with `free_bytes` free (and mount flags
    `flag`, such as os.ST_RDONLY), whatever the path."""
    block = 4096
    free = size_bytes if free_bytes is None else free_bytes
    result = os.statvfs_result((block, block, size_bytes // block, free // block, free // block, 0, 0, 0, flag, 255))
    return lambda _path: result


class HostTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc, self.sys, self.cgroup = root / "proc", root / "sys", root / "cgroup"
        for d in (self.proc / "self", self.sys, self.cgroup):
            d.mkdir(parents=True, exist_ok=True)
        self.write(self.proc / "self" / "cgroup", "0::/\n")

    def write(self, path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    # --- cgroups ---
    def cgroup_v2(
        self,
        path: str = "/",
        cpu_max: str | None = None,
        cpuset: str | None = None,
        memory_max: str | None = None,
        memory_current: int | None = None,
        inactive_file: int = 0,
    ) -> Path:
        """A pure v2 box; the process in cgroup `path` with these files there."""
        self.write(self.cgroup / "cgroup.controllers", "cpuset cpu io memory pids\n")
        self.write(self.proc / "self" / "cgroup", f"0::{path}\n")
        own = self.cgroup / path.strip("/")
        own.mkdir(parents=True, exist_ok=True)
        if cpu_max is not None:
            self.write(own / "cpu.max", cpu_max + "\n")
        if cpuset is not None:
            self.write(own / "cpuset.cpus.effective", cpuset + "\n")
        if memory_max is not None:
            self.write(own / "memory.max", memory_max + "\n")
            self.write(own / "memory.current", f"{memory_current or 0}\n")
            self.write(own / "memory.stat", f"anon 0\ninactive_file {inactive_file}\n")
        return own

    def cgroup_v1(
        self,
        path: str = "/",
        quota_us: int | None = None,
        period_us: int = 100000,
        cpuset: str | None = None,
        memory_limit: int | None = None,
        memory_usage: int = 0,
        cpu_dir: str = "cpu,cpuacct",
    ) -> Path:
        """A hybrid v1 box, as Docker without a cgroup namespace shows it; returns the cpu folder."""
        self.write(
            self.proc / "self" / "cgroup",
            f"12:memory:{path}\n4:{cpu_dir}:{path}\n3:cpuset:{path}\n1:name=systemd:{path}\n0::/\n",
        )
        (self.cgroup / "unified").mkdir(exist_ok=True)
        cpu = self.cgroup / cpu_dir / path.strip("/")
        cpu.mkdir(parents=True, exist_ok=True)
        if quota_us is not None:
            self.write(cpu / "cpu.cfs_quota_us", f"{quota_us}\n")
            self.write(cpu / "cpu.cfs_period_us", f"{period_us}\n")
        if cpuset is not None:
            self.write(self.cgroup / "cpuset" / path.strip("/") / "cpuset.cpus", cpuset + "\n")
        if memory_limit is not None:
            mem = self.cgroup / "memory" / path.strip("/")
            self.write(mem / "memory.limit_in_bytes", f"{memory_limit}\n")
            self.write(mem / "memory.usage_in_bytes", f"{memory_usage}\n")
            self.write(mem / "memory.stat", "total_inactive_file 0\n")
        return cpu

    # --- CPUs, NUMA, GPUs ---
    def online(self, cpulist: str) -> None:
        self.write(self.sys / "devices" / "system" / "cpu" / "online", cpulist + "\n")

    def numa(self, nodes: Mapping[int, str]) -> None:
        """NUMA node -> its cpulist."""
        for node, cpulist in nodes.items():
            self.write(self.sys / "devices" / "system" / "node" / f"node{node}" / "cpulist", cpulist + "\n")

    def gpu(self, bdf: str, numa_node: int) -> None:
        self.write(self.sys / "bus" / "pci" / "devices" / bdf / "numa_node", f"{numa_node}\n")

    def governor(self, cpus: range | list[int], governor: str, driver: str, epp: str | None = None) -> None:
        for cpu in cpus:
            freq = self.sys / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cpufreq"
            self.write(freq / "scaling_governor", governor + "\n")
            self.write(freq / "scaling_driver", driver + "\n")
            if epp is not None:
                self.write(freq / "energy_performance_preference", epp + "\n")

    def rdma(self, name: str = "mlx5_0") -> None:
        (self.sys / "class" / "infiniband" / name).mkdir(parents=True, exist_ok=True)

    # --- memory, mounts ---
    def meminfo(self, total_mib: int, available_mib: int) -> None:
        self.write(
            self.proc / "meminfo",
            f"MemTotal:       {total_mib * 1024} kB\nMemFree:        1024 kB\n"
            f"MemAvailable:   {available_mib * 1024} kB\nHugePages_Total:       0\n",
        )

    def mountinfo(self, lines: list[str]) -> None:
        self.write(self.proc / "self" / "mountinfo", "\n".join(lines) + "\n")

    def view(
        self,
        affinity: set[int] | range | None = None,
        environ: Mapping[str, str] | None = None,
        memlock: tuple[int | None, int | None] | None = (64 * MiB, 64 * MiB),
        statvfs: Callable[[str], os.statvfs_result] | None = None,
        shm: Path | None = None,
    ) -> HostView:
        return HostView(
            proc=self.proc,
            sys=self.sys,
            cgroup=self.cgroup,
            shm=shm or self.root / "shm",
            statvfs=statvfs or fake_statvfs(16 * 1024 * MiB),
            environ=dict(environ or {}),
            affinity=None if affinity is None else frozenset(affinity),
            memlock=memlock,
        )


@contextlib.contextmanager
def tmpfs(where: Path, size_mib: int, *options: str) -> Iterator[Path]:
    """A real tmpfs of `size_mib` (mounted with `options` too, such as "ro") at `where` for the block,
    unmounted after; the test is skipped, saying why, where this machine refuses to mount (not root, or
    no CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join((f"size={size_mib}m", *options)), "tmpfs", str(where)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"this machine refuses to mount a tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, stdin=subprocess.DEVNULL, timeout=30, check=True)
