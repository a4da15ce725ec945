"""What the host checks read, in one injectable view: the roots of /proc, /sys and the cgroup
mount, /dev/shm, the environment, the CPU affinity and the memlock limit. Tests point it at a fake
tree; `HostView.live()` reads this machine.

Also the helpers other checks reuse: the CPUs this process may really use (affinity, cpuset and
the cgroup CPU quota, never os.cpu_count()), and the CPUs of the NUMA node a GPU sits on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # not on every platform; then the memlock limit is unknown
    resource = None  # type: ignore[assignment]


@dataclass(frozen=True)
class HostView:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    cgroup: Path = Path("/sys/fs/cgroup")
    shm: Path = Path("/dev/shm")
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs
    environ: Mapping[str, str] = field(default_factory=dict)
    affinity: frozenset[int] | None = None  # os.sched_getaffinity(0); None where the OS has no such call
    # RLIMIT_MEMLOCK (soft, hard) in bytes; None inside: unlimited. None: not known on this OS
    memlock: tuple[int | None, int | None] | None = None

    @classmethod
    def live(cls) -> HostView:
        affinity = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        memlock = None
        if resource is not None:
            soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            memlock = (_finite(soft), _finite(hard))
        return cls(environ=dict(os.environ), affinity=affinity, memlock=memlock)


def _finite(limit: int) -> int | None:
    return None if resource is None or limit == resource.RLIM_INFINITY or limit < 0 else limit


def read_text(path: Path) -> str | None:
    """A small sysfs/procfs file, stripped; None when it is missing or unreadable."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def parse_cpulist(text: str) -> frozenset[int]:
    """The kernel's CPU list format: "0-3,8,10-15" (optionally "0-15:2/4": 2 of every 4)."""
    cpus: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        span, _, stride = part.partition(":")
        first, _, last = span.partition("-")
        lo, hi = int(first), int(last or first)
        used, group = (int(x) for x in stride.split("/")) if stride else (1, 1)
        cpus.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
    return frozenset(cpus)


def format_cpulist(cpus: frozenset[int] | set[int]) -> str:
    """The inverse of parse_cpulist, for details and for `taskset -c`."""
    runs: list[str] = []
    for cpu in sorted(cpus):
        if runs and cpu == _run_end(runs[-1]) + 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{cpu}"
        else:
            runs.append(str(cpu))
    return ",".join(runs)


def _run_end(run: str) -> int:
    return int(run.rsplit("-", 1)[-1])


# --- cgroups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupDirs:
    """The directories of one controller that apply to this process, its own first, then each
    ancestor up to the mount root (limits of a parent bind its children too)."""

    version: int  # 1 or 2
    dirs: tuple[Path, ...]


def cgroup_dirs(view: HostView, controller: str) -> CgroupDirs | None:
    """Where `controller` ("cpu", "cpuset", "memory") is for this process, from /proc/self/cgroup:
    a v1 hierarchy that names it wins (hybrid boxes), else the v2 unified one."""
    text = read_text(view.proc / "self" / "cgroup")
    if text is None:
        return None
    v2_path: str | None = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif controller in controllers.split(","):
            for name in (controller, controllers):  # "cpu" is often a link to "cpu,cpuacct"
                if (view.cgroup / name).is_dir():
                    return CgroupDirs(1, _ancestry(view.cgroup / name, path))
            return None
    if v2_path is None:
        return None
    # A pure v2 box mounts the unified tree at the root; a hybrid one under "unified".
    root = view.cgroup if (view.cgroup / "cgroup.controllers").exists() else view.cgroup / "unified"
    return CgroupDirs(2, _ancestry(root, v2_path)) if root.is_dir() else None


def _ancestry(root: Path, path: str) -> tuple[Path, ...]:
    """The process's cgroup and its ancestors under `root`. Without a cgroup namespace a container
    sees its host path (/docker/<id>) while its own cgroup is mounted as the root: then the root."""
    own = root / path.strip("/")
    if not own.is_dir():
        return (root,)
    dirs = [own]
    while dirs[-1] != root and root in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return tuple(dirs)


@dataclass(frozen=True)
class CpuQuota:
    cpus: float  # CPUs' worth of time per period
    source: str  # "cgroup v2 cpu.max" or "cgroup v1 cpu.cfs_quota_us"
    path: Path
    raw: str


def cpu_quota(view: HostView) -> CpuQuota | None:
    """The tightest CPU quota on the process's cgroup or its ancestors; None: no quota."""
    where = cgroup_dirs(view, "cpu")
    if where is None:
        return None
    quotas = _v2_quotas(where.dirs) if where.version == 2 else _v1_quotas(where.dirs)
    return min(quotas, key=lambda q: q.cpus, default=None)


def _v2_quotas(dirs: tuple[Path, ...]) -> Iterator[CpuQuota]:
    for d in dirs:
        raw = read_text(d / "cpu.max")  # "max 100000" (none) or "150000 100000"
        parts = (raw or "").split()
        if len(parts) == 2 and parts[0] != "max" and _positive(parts[0]) and _positive(parts[1]):
            yield CpuQuota(int(parts[0]) / int(parts[1]), "cgroup v2 cpu.max", d / "cpu.max", raw or "")


def _v1_quotas(dirs: tuple[Path, ...]) -> Iterator[CpuQuota]:
    for d in dirs:
        quota, period = read_text(d / "cpu.cfs_quota_us"), read_text(d / "cpu.cfs_period_us")
        if quota and period and _positive(quota) and _positive(period):  # -1: no quota
            yield CpuQuota(int(quota) / int(period), "cgroup v1 cpu.cfs_quota_us", d / "cpu.cfs_quota_us", quota)


def _positive(text: str) -> bool:
    return text.isdigit() and int(text) > 0


def cgroup_cpuset(view: HostView) -> tuple[frozenset[int], Path] | None:
    """The CPUs the cgroup's cpuset grants (the effective list where the kernel gives one)."""
    where = cgroup_dirs(view, "cpuset")
    if where is None:
        return None
    names = ("cpuset.cpus.effective",) if where.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
    for name in names:
        raw = read_text(where.dirs[0] / name)
        if raw:
            return parse_cpulist(raw), where.dirs[0] / name
    return None


# --- usable CPUs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsableCpus:
    count: float | None  # CPUs' worth of time this process may use; fractional under a quota; None: unknown
    how: str  # what binds: "affinity", "cpuset", "cgroup v2 cpu.max", "cgroup v1 cpu.cfs_quota_us", "online CPUs"
    cpus: frozenset[int]  # the CPUs it may run on (affinity and cpuset together)
    quota: CpuQuota | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


def online_cpus(view: HostView) -> frozenset[int] | None:
    raw = read_text(view.sys / "devices" / "system" / "cpu" / "online")
    return parse_cpulist(raw) if raw else None


def usable_cpus(view: HostView) -> UsableCpus:
    """The CPUs this process may use, and which limit decides it. os.cpu_count() counts the box's
    CPUs, not the container's: a loader sized from it oversubscribes a CPU quota."""
    evidence: dict[str, Any] = {}
    cpus, how = view.affinity, "affinity"
    if cpus is None:
        cpus, how = online_cpus(view), "online CPUs"
    if cpus is not None:
        evidence[how.replace(" ", "_")] = format_cpulist(cpus)
    cpuset = cgroup_cpuset(view)
    if cpuset is not None:
        evidence["cpuset"], evidence["cpuset_file"] = format_cpulist(cpuset[0]), str(cpuset[1])
        # The kernel keeps affinity inside the cpuset; a smaller cpuset only shows where it does not.
        if cpus is None or len(cpuset[0] & cpus) < len(cpus):
            cpus, how = cpuset[0] if cpus is None else cpuset[0] & cpus, "cpuset"
    quota = cpu_quota(view)
    if quota is not None:
        evidence["quota_cpus"], evidence["quota_file"], evidence["quota_raw"] = quota.cpus, str(quota.path), quota.raw
    if cpus is None:
        return UsableCpus(
            quota.cpus if quota else None, quota.source if quota else "unknown", frozenset(), quota, evidence
        )
    count: float = len(cpus)
    if quota is not None and quota.cpus < count:
        count, how = quota.cpus, quota.source
    return UsableCpus(count, how, frozenset(cpus), quota, evidence)


# --- NUMA --------------------------------------------------------------------------------------


def numa_nodes(view: HostView) -> dict[int, frozenset[int]]:
    """NUMA node -> its CPUs, from /sys/devices/system/node; empty where the kernel has no NUMA."""
    nodes: dict[int, frozenset[int]] = {}
    base = view.sys / "devices" / "system" / "node"
    try:
        entries = list(base.iterdir())
    except OSError:
        return nodes
    for entry in entries:
        name = entry.name
        if name.startswith("node") and name[4:].isdigit():
            nodes[int(name[4:])] = parse_cpulist(read_text(entry / "cpulist") or "")
    return dict(sorted(nodes.items()))


def sysfs_bdf(pci_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs names it: "0000:18:00.0"."""
    bdf = pci_bus_id.strip().lower()
    domain, _, rest = bdf.partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if rest else bdf


@dataclass(frozen=True)
class GpuNuma:
    node: int | None  # None: the kernel does not say (no sysfs entry, or numa_node -1)
    node_cpus: frozenset[int]  # every CPU of that node
    cpus: frozenset[int]  # those this process may use: where to run the thread that fills host buffers
    why: str | None = None  # why `node` is None


def gpu_numa_cpus(view: HostView, pci_bus_id: str) -> GpuNuma:
    """The NUMA node the GPU hangs off and the CPUs of that node this process may use. Host buffers
    touched first from these CPUs are allocated on that node, so copies skip the socket link."""
    bdf = sysfs_bdf(pci_bus_id)
    raw = read_text(view.sys / "bus" / "pci" / "devices" / bdf / "numa_node")
    if raw is None:
        return GpuNuma(None, frozenset(), frozenset(), f"no /sys/bus/pci/devices/{bdf}/numa_node")
    if not raw.lstrip("-").isdigit() or int(raw) < 0:
        return GpuNuma(None, frozenset(), frozenset(), f"the firmware gives {bdf} no NUMA node (numa_node {raw})")
    node = int(raw)
    node_cpus = numa_nodes(view).get(node)
    if node_cpus is None:
        return GpuNuma(None, frozenset(), frozenset(), f"{bdf} is on NUMA node {node}, which /sys does not list")
    usable = usable_cpus(view).cpus
    return GpuNuma(node, node_cpus, node_cpus & usable if usable else node_cpus)
