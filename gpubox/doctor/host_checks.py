"""Checks of the host around the GPUs: shared memory for loader workers, the CPUs the process may
use, NUMA placement of each GPU, the CPU frequency governor, the memlock limit, free memory, and
environment variables that slow or break CUDA. Pure functions of a HostView and the NVML facts."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from gpubox.doctor.guard import TimedOut, within
from gpubox.doctor.host_env import environment_check
from gpubox.doctor.host_view import (
    HostView,
    UsableCpus,
    cgroup_dirs,
    format_cpulist,
    gpu_numa_cpus,
    numa_nodes,
    online_cpus,
    read_text,
    usable_cpus,
)
from gpubox.doctor.model import Check, Status, SystemFacts, skipped
from gpubox.doctor.thresholds import Thresholds
from gpubox.format import size

MiB = 1024 * 1024
GiB = 1024 * MiB
HOST = "host"


def host_checks(view: HostView, facts: SystemFacts, thresholds: Thresholds, *, pinned_bytes: int = 0) -> list[Check]:
    """Every host check. `pinned_bytes`: page-locked host memory about to be allocated (the
    transfer benchmark's buffers), which must fit in the memory available."""
    t, gpus = thresholds, len(facts.gpus)
    try:
        cpus = usable_cpus(view)
    except (OSError, ValueError) as exc:  # a garbled cpuset or quota file
        cpus = UsableCpus(None, f"unreadable: {exc}", frozenset())
    checks = [
        _safely("host.shm_size", "/dev/shm size", lambda: shm_check(view, gpus, t)),
        _safely("host.usable_cpus", "Usable CPUs", lambda: cpus_check(view, cpus, gpus, t)),
    ]
    try:
        checks += numa_checks(view, facts)
    except (OSError, ValueError) as exc:
        checks.append(skipped("host.numa", "GPU NUMA placement", HOST, f"could not read the NUMA layout: {exc}"))
    checks += [
        _safely("host.cpu_governor", "CPU frequency governor", lambda: governor_check(view, cpus)),
        _safely("host.memlock", "Locked-memory limit", lambda: memlock_check(view, t)),
        _safely("host.memory", "Available memory", lambda: memory_check(view, t, pinned_bytes)),
        _safely("host.environment", "CUDA environment variables", lambda: environment_check(view, facts, cpus)),
    ]
    return checks


CHECK_TIMEOUT_S = 5.0  # a statvfs or read that hangs (a stale mount) costs one check, not the report


def _safely(id: str, title: str, make: Callable[[], Check]) -> Check:
    # /proc and /sys answer oddly in some containers: that costs one check, not the group.
    try:
        return within(CHECK_TIMEOUT_S, make)
    except TimedOut as exc:
        return Check(id, title, HOST, "warn", f"{title}: {exc}", meaning="What it reads did not answer in time.")
    except (OSError, ValueError) as exc:
        return skipped(id, title, HOST, f"could not read what it needs: {type(exc).__name__}: {exc}")


# --- /dev/shm ----------------------------------------------------------------------------------


def shm_check(view: HostView, gpus: int, t: Thresholds) -> Check:
    id, title = "host.shm_size", "/dev/shm size"
    fail_at, warn_at = t.shm_fail_mib * MiB, max(1, gpus) * t.shm_warn_mib_per_gpu * MiB
    suggest = max(16, math.ceil(warn_at / GiB))
    try:
        st = view.statvfs(str(view.shm))
    except FileNotFoundError:
        return _no_shm(view.shm, suggest)
    except OSError as exc:
        return skipped(id, title, HOST, f"cannot read {view.shm}: {exc.strerror or exc}")
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    evidence = {"size_bytes": total, "free_bytes": free, "gpus": gpus, "fail_bytes": fail_at, "warn_bytes": warn_at}
    detail = f"{size(free)} free of {size(total)}" + (f" for {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "")
    grow = (
        f"Give the container more: `docker run --shm-size={suggest}g ...` or `--ipc=host`; Kubernetes: mount an "
        f"emptyDir with `medium: Memory` at /dev/shm. On the host itself: "
        f"`sudo mount -o remount,size={suggest}G /dev/shm`. Meanwhile DataLoader(num_workers=0) avoids it."
    )
    clean = (
        "See what holds it: `du -sh /dev/shm/* | sort -h | tail`; files that killed jobs left (nccl-*, torch_*, "
        "psm_*) can be removed once no process has them open (`lsof +D /dev/shm`)."
    )
    workers = (
        "DataLoader workers hand every batch to the training process through shared memory in /dev/shm; "
        "when it is full a worker dies with 'Bus error' or 'No space left on device' and training stops."
    )
    status: Status = "ok"
    meaning, fix, impact = "Room in /dev/shm for the batches loader workers pass to the training process.", None, 0.0
    if st.f_flag & os.ST_RDONLY:  # however large, no worker can create its buffers (or its locks) there
        status, impact, detail, evidence["read_only"] = "fail", 0.9, f"{detail}, read-only", True
        meaning = (
            "DataLoader workers hand every batch to the training process through shared memory in /dev/shm, and "
            "it is read-only: a DataLoader with workers stops at its start (OSError: Read-only file system)."
        )
        fix = (
            f"Mount it writable: `sudo mount -o remount,rw {view.shm}`; in a container, give it a writable one "
            "(`--ipc=host`; Kubernetes: an emptyDir with `medium: Memory` at /dev/shm). Meanwhile "
            "DataLoader(num_workers=0) avoids it."
        )
    elif total < fail_at:
        status, impact, fix = "fail", 0.9, grow
        meaning = f"{workers} A container's /dev/shm is 64 MiB unless it is given more."
    elif free < fail_at:
        status, impact, fix = "fail", 0.9, clean
        meaning = f"{workers} It is large enough but nearly full."
    elif total < warn_at:
        status, impact, fix = "warn", 0.4, grow
        meaning = (
            f"{workers} Below {size(t.shm_warn_mib_per_gpu * MiB)} per GPU, several workers with large batches fill it."
        )
    elif free < warn_at:
        status, impact, fix = "warn", 0.3, clean
        meaning = f"{workers} Most of it is taken already."
    return Check(id, title, HOST, status, detail, total, "bytes", meaning, fix, None, impact, evidence)


def _no_shm(shm: Path, suggest_gib: int) -> Check:
    """No /dev/shm, or a link to a folder that does not exist: shm_open makes its objects there, and
    torch's DataLoader workers stop at their first batch ("unable to open shared memory object")."""
    where, detail = shm, f"{shm} does not exist"
    if shm.is_symlink():
        where = Path(os.path.join(shm.parent, os.readlink(shm)))
        detail = f"{shm} links to {where}, which does not exist"
    return Check(
        "host.shm_size",
        "/dev/shm size",
        HOST,
        "fail",
        detail,
        unit="bytes",
        meaning="DataLoader workers hand every batch to the training process through shared memory in "
        "/dev/shm, and there is none: a DataLoader with workers stops at its first batch.",
        fix=f"Mount one: `sudo mkdir -p {where} && sudo mount -t tmpfs -o size={suggest_gib}G tmpfs {where}`; in "
        f"a container, `--ipc=host` or `--shm-size={suggest_gib}g` (Kubernetes: an emptyDir with `medium: "
        "Memory` at /dev/shm). Meanwhile DataLoader(num_workers=0) avoids it.",
        impact=0.9,
        evidence={"missing": True},
    )


# --- CPUs --------------------------------------------------------------------------------------


def cpus_check(view: HostView, cpus: UsableCpus, gpus: int, t: Thresholds) -> Check:
    id, title = "host.usable_cpus", "Usable CPUs"
    if cpus.count is None:
        why = "neither the CPU affinity nor /sys/devices/system/cpu/online could be read"
        return skipped(id, title, HOST, why if cpus.how == "unknown" else f"CPU limits {cpus.how}")
    online = online_cpus(view)
    evidence = {**cpus.evidence, "how": cpus.how, "gpus": gpus, "online": len(online) if online else None}
    detail = f"{cpus.count:g} usable CPUs ({cpus.how})"
    if online and len(online) > cpus.count:
        detail += f" of {len(online)} online"
    if not gpus:
        meaning = "The CPUs this process may use; os.cpu_count() counts the box's, not these."
        return Check(id, title, HOST, "ok", detail, cpus.count, "count", meaning, evidence=evidence)
    per_gpu = cpus.count / gpus
    detail += f", {per_gpu:.1f} per GPU for {gpus} GPU{'s' if gpus != 1 else ''}"
    evidence["per_gpu"] = per_gpu
    if per_gpu >= t.cpus_per_gpu_warn:
        meaning = "Enough CPUs per GPU for the training process and its loader workers."
        return Check(id, title, HOST, "ok", detail, cpus.count, "count", meaning, evidence=evidence)
    workers = max(1, math.floor(per_gpu) - 1)
    wanted = math.ceil(t.cpus_per_gpu_warn * gpus)
    raise_it = {
        "cgroup v2 cpu.max": f"Raise the CPU quota: `docker run --cpus={wanted}`, Kubernetes `resources.limits.cpu: "
        f"{wanted}`, systemd `CPUQuota={wanted * 100}%`",
        "cgroup v1 cpu.cfs_quota_us": f"Raise the CPU quota: `docker run --cpus={wanted}`, Kubernetes "
        f"`resources.limits.cpu: {wanted}`",
        "cpuset": f"Grant more CPUs to the cgroup: `docker run --cpuset-cpus=<{wanted} CPUs>` (or drop the option)",
    }.get(cpus.how)
    if raise_it is None and online and len(cpus.cpus) < len(online):
        raise_it = f"Start the job on more CPUs: it is pinned (taskset, numactl or its launcher) to {len(cpus.cpus)}"
    elif raise_it is None:
        raise_it = f"The box has {cpus.count:g} CPUs for {gpus} GPUs: give each job fewer GPUs"
    meaning = (
        f"Each GPU's loader workers, the training process and its CUDA launch thread need CPU time; with "
        f"{per_gpu:.1f} CPUs per GPU (under {t.cpus_per_gpu_warn:g}) the workers queue for CPUs and the GPUs "
        f"wait for batches. Worker counts taken from os.cpu_count() oversubscribe a quota further."
    )
    fix = f"{raise_it}; or size the loader to what there is: DataLoader(num_workers={workers}) per GPU."
    impact = min(0.6, max(0.1, 0.6 * (1 - per_gpu / t.cpus_per_gpu_warn)))
    return Check(id, title, HOST, "warn", detail, cpus.count, "count", meaning, fix, None, round(impact, 2), evidence)


def numa_checks(view: HostView, facts: SystemFacts) -> list[Check]:
    """One check per GPU on a box with several NUMA nodes: may this process run on the GPU's node?"""
    id, title = "host.numa", "GPU NUMA placement"
    if not facts.gpus:
        return [skipped(id, title, HOST, f"no GPU to place: {facts.nvml_error or 'NVML lists none'}")]
    nodes = numa_nodes(view)
    if len(nodes) <= 1:
        why = "one NUMA node: every CPU is as near to each GPU" if nodes else "the kernel shows no NUMA nodes"
        return [skipped(id, title, HOST, why)]
    usable = usable_cpus(view).cpus
    checks: list[Check] = []
    for gpu in facts.gpus:
        if gpu.pci_bus_id is None:
            checks.append(skipped(id, title, HOST, "NVML gives no PCI bus id for this GPU", gpu=gpu.index))
            continue
        place = gpu_numa_cpus(view, gpu.pci_bus_id)
        if place.node is None:
            checks.append(skipped(id, title, HOST, place.why or "the GPU's NUMA node is unknown", gpu=gpu.index))
            continue
        node_list = format_cpulist(place.node_cpus)
        evidence = {
            "pci_bus_id": gpu.pci_bus_id,
            "node": place.node,
            "node_cpus": node_list,
            "usable_cpus": format_cpulist(usable),
            "usable_on_node": format_cpulist(place.cpus),
        }
        where = f"GPU {gpu.index} is on NUMA node {place.node} (CPUs {node_list})"
        if place.cpus:
            detail = f"{where}; this process may use {len(place.cpus)} of them"
            meaning = "Host buffers and loader workers can live on the GPU's own node."
            checks.append(
                Check(id, title, HOST, "ok", detail, place.node, "node", meaning, None, gpu.index, 0.0, evidence)
            )
            continue
        detail = f"{where}; this process may use none of them (only {format_cpulist(usable)})"
        meaning = (
            "Host memory is allocated on the node of the CPU that first touches it, so pinned buffers and loader "
            "output land on another node and every copy to this GPU crosses the socket link: less bandwidth, "
            "more latency."
        )
        fix = (
            f"Run the job on the GPU's node: `numactl --cpunodebind={place.node} --membind={place.node} python "
            f"train.py` (or `taskset -c {node_list}`); Docker: `--cpuset-cpus={node_list} --cpuset-mems={place.node}`. "
            f"`nvidia-smi topo -m` shows each GPU's CPU and NUMA affinity."
        )
        checks.append(
            Check(id, title, HOST, "warn", detail, place.node, "node", meaning, fix, gpu.index, 0.2, evidence)
        )
    return checks


# --- CPU frequency governor --------------------------------------------------------------------

# In active mode these drivers pick the clock themselves; "powersave" there is not the generic
# governor that pins the lowest frequency (kernel docs: intel_pstate, amd-pstate).
_SELF_SCALING = frozenset({"intel_pstate", "amd-pstate-epp"})


def _grade(driver: str, governor: str, epp: str | None) -> tuple[Status, float, str]:
    if governor == "performance":
        return "ok", 0.0, "performance runs the CPUs at their highest clock (or, under a P-state driver, near it)"
    if governor == "schedutil":
        return "ok", 0.0, "schedutil sets the clock from the scheduler's load as it changes"
    if governor == "powersave" and driver in _SELF_SCALING:
        if epp == "power":
            return "warn", 0.15, f"{driver} with energy_performance_preference 'power' favours low clocks"
        return "ok", 0.0, f"under {driver}, powersave lets the CPU pick its clock by load; it is not pinned low"
    if governor == "powersave":
        return "warn", 0.5, f"powersave under {driver} holds every CPU at its lowest clock (scaling_min_freq)"
    if governor == "conservative":
        return "warn", 0.2, "conservative raises the clock one step at a time, so bursts of loader work run slow"
    if governor == "ondemand":
        return "warn", 0.1, "ondemand raises the clock only after it samples load, so short bursts run slow"
    if governor == "userspace":
        return "warn", 0.1, "userspace: a program fixes the clock; check which and at what frequency"
    return "ok", 0.0, f"{governor}: not known to hold clocks down"


def governor_check(view: HostView, cpus: UsableCpus) -> Check:
    id, title = "host.cpu_governor", "CPU frequency governor"
    base = view.sys / "devices" / "system" / "cpu"
    which = cpus.cpus or online_cpus(view) or frozenset()
    seen: dict[tuple[str, str, str | None], set[int]] = {}
    for cpu in sorted(which):
        freq = base / f"cpu{cpu}" / "cpufreq"
        governor = read_text(freq / "scaling_governor")
        if governor:
            key = (
                read_text(freq / "scaling_driver") or "unknown",
                governor,
                read_text(freq / "energy_performance_preference"),
            )
            seen.setdefault(key, set()).add(cpu)
    if not seen:
        why = "no cpufreq under /sys/devices/system/cpu: a VM or firmware-managed clocks, nothing to set here"
        return skipped(id, title, HOST, why)
    graded = sorted(((_grade(*key), key, group) for key, group in seen.items()), key=lambda g: (-g[0][1], -len(g[2])))
    (status, impact, why), (driver, governor, epp), group = graded[0]
    evidence = {
        "governors": {f"{d}/{g}" + (f"/{e}" if e else ""): format_cpulist(c) for (d, g, e), c in seen.items()},
        "cpus_checked": len(which),
    }
    share = "all" if len(group) == len(which) else f"{len(group)} of"
    detail = f"{governor} on {share} {len(which)} usable CPUs ({driver})"
    if status == "ok":
        return Check(id, title, HOST, "ok", detail, governor, None, why[0].upper() + why[1:] + ".", evidence=evidence)
    if epp == "power":
        fix = "`echo balance_performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/energy_performance_preference`"
    else:
        fix = (
            "`sudo cpupower frequency-set -g performance` (or `echo performance | sudo tee "
            "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor`)"
        )
    fix += "; to keep it across reboots: `sudo tuned-adm profile throughput-performance`. In a container, on the host."
    meaning = f"{why[0].upper() + why[1:]}. Decoding and augmenting batches, and launching kernels, run at that clock."
    return Check(id, title, HOST, "warn", detail, governor, None, meaning, fix, None, impact, evidence)


# --- memlock and memory ------------------------------------------------------------------------


def rdma_devices(view: HostView) -> list[str]:
    try:
        return sorted(p.name for p in (view.sys / "class" / "infiniband").iterdir())
    except OSError:
        return []


def memlock_check(view: HostView, t: Thresholds) -> Check:
    id, title = "host.memlock", "Locked-memory limit"
    if view.memlock is None:
        return skipped(id, title, HOST, "the locked-memory limit (RLIMIT_MEMLOCK) is not known on this system")
    soft, hard = view.memlock
    rdma = rdma_devices(view)
    evidence = {"soft_bytes": soft, "hard_bytes": hard, "rdma_devices": rdma, "warn_bytes": t.memlock_warn_mib * MiB}
    shown = "unlimited" if soft is None else size(soft)
    about = "It limits memory that RDMA (InfiniBand, RoCE) registers; CUDA's pinned memory is not held to it."
    if soft is None or soft >= t.memlock_warn_mib * MiB:
        return Check(id, title, HOST, "ok", f"memlock {shown}", soft, "bytes", about, evidence=evidence)
    if not rdma:
        detail = f"memlock {shown}; no RDMA devices here, so nothing needs more"
        return Check(id, title, HOST, "ok", detail, soft, "bytes", about, evidence=evidence)
    detail = f"memlock {shown} with RDMA devices {', '.join(rdma)}"
    meaning = (
        "NCCL and GPUDirect RDMA lock the buffers they register with the network card against this limit; "
        "below it registration fails (ibv_reg_mr errors) and NCCL stops or falls back to TCP sockets."
    )
    now = "`ulimit -l unlimited` in the shell that starts the job; " if hard is None else ""
    fix = (
        f"{now}Docker: `--ulimit memlock=-1`; systemd: `LimitMEMLOCK=infinity`; "
        "otherwise `* - memlock unlimited` in /etc/security/limits.conf and log in again."
    )
    return Check(id, title, HOST, "warn", detail, soft, "bytes", meaning, fix, None, 0.3, evidence)


def meminfo(view: HostView) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in (read_text(view.proc / "meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name.strip()] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def cgroup_memory(view: HostView) -> tuple[int, int, Path] | None:
    """(limit, available under it, the file) for the tightest memory limit on the process's cgroup
    and its ancestors; reclaimable page cache (inactive_file) counts as available, as in docker stats."""
    where = cgroup_dirs(view, "memory")
    if where is None:
        return None
    names = ("memory.max", "memory.current", "inactive_file")
    if where.version == 1:
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    best: tuple[int, int, Path] | None = None
    for d in where.dirs:
        limit, usage = read_text(d / names[0]), read_text(d / names[1])
        if not (limit and limit.isdigit() and usage and usage.isdigit()) or int(limit) >= 2**60:  # v1: no limit
            continue
        stat = dict(line.split(maxsplit=1) for line in (read_text(d / "memory.stat") or "").splitlines() if " " in line)
        inactive = int(stat.get(names[2], "0"))
        available = max(0, int(limit) - max(0, int(usage) - inactive))
        if best is None or available < best[1]:
            best = (int(limit), available, d / names[0])
    return best


def memory_check(view: HostView, t: Thresholds, pinned_bytes: int = 0) -> Check:
    id, title = "host.memory", "Available memory"
    info = meminfo(view)
    if "MemTotal" not in info or "MemAvailable" not in info:
        return skipped(id, title, HOST, "no MemTotal or MemAvailable in /proc/meminfo")
    total, available = info["MemTotal"], info["MemAvailable"]
    evidence: dict[str, object] = {
        "mem_total_bytes": total,
        "mem_available_bytes": available,
        "pinned_bytes": pinned_bytes,
    }
    limited = cgroup_memory(view)
    if limited is not None and limited[0] < total:
        total, available = limited[0], min(available, limited[1])
        evidence.update(cgroup_limit_bytes=limited[0], cgroup_available_bytes=limited[1], cgroup_file=str(limited[2]))
    headroom = available - pinned_bytes
    evidence["headroom_bytes"] = headroom
    detail = f"{size(available)} available of {size(total)}" + (" (cgroup limit)" if "cgroup_file" in evidence else "")
    if pinned_bytes:
        detail += f"; {size(pinned_bytes)} to pin leaves {size(max(0, headroom))}"
    fix = (
        "See what holds memory: `ps aux --sort=-rss | head`; lower num_workers or prefetch_factor (each worker "
        "holds prefetch_factor batches); in a container raise `--memory` or `resources.limits.memory`."
    )
    if headroom < 0:
        meaning = "Pinned memory cannot be swapped or reclaimed: this much does not fit, and the OOM killer steps in."
        return Check(id, title, HOST, "fail", detail, available, "bytes", meaning, fix, None, 0.6, evidence)
    if headroom < t.mem_available_warn_fraction * total:
        meaning = (
            f"Under {t.mem_available_warn_fraction:.0%} of memory is free: the page cache that keeps the dataset "
            "shrinks so reads go back to disk, and workers and pinned buffers risk swapping or the OOM killer."
        )
        return Check(id, title, HOST, "warn", detail, available, "bytes", meaning, fix, None, 0.3, evidence)
    meaning = "Room for loader workers, pinned buffers and the page cache that keeps the dataset."
    return Check(id, title, HOST, "ok", detail, available, "bytes", meaning, evidence=evidence)
