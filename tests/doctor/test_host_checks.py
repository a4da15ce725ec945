"""Host checks against a fake /proc, /sys and cgroup tree: quotas, cpusets, NUMA, governors,
memory, memlock, environment variables, and /dev/shm (a real 64 MiB tmpfs where the machine
lets us mount one, a fake statvfs everywhere)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from gpubox.doctor.examine import DoctorOptions, Sources, examine
from gpubox.doctor.host_checks import (
    cpus_check,
    governor_check,
    host_checks,
    memlock_check,
    memory_check,
    numa_checks,
    shm_check,
)
from gpubox.doctor.host_env import environment_check
from gpubox.doctor.host_view import (
    HostView,
    format_cpulist,
    gpu_numa_cpus,
    parse_cpulist,
    sysfs_bdf,
    usable_cpus,
)
from gpubox.doctor.model import Check, GpuFacts, SystemFacts
from gpubox.doctor.thresholds import Thresholds
from tests.doctor.host_tree import HostTree, MiB, fake_statvfs, tmpfs
from tests.fake_nvml import scenarios

GiB = 1024 * MiB
T = Thresholds()
BDFS = ("0000:18:00.0", "0000:af:00.0")


def facts(n: int = 2, error: str | None = None) -> SystemFacts:
    gpus = tuple(
        GpuFacts(index=i, uuid=f"GPU-{i}aaaaaaa-1111-2222-3333-444444444444", name="H100", pci_bus_id=BDFS[i % 2])
        for i in range(n)
    )
    return SystemFacts("550.54", 12040, gpus, nvml_error=error)


@pytest.fixture
def tree(tmp_path: Path) -> HostTree:
    return HostTree(tmp_path / "host")


# --- cpulists and usable CPUs ------------------------------------------------------------------


def test_cpulists_parse_and_format() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("0-7:2/4") == {0, 1, 4, 5}
    assert parse_cpulist("") == frozenset()
    assert format_cpulist(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
    assert sysfs_bdf("00000000:AF:00.0") == "0000:af:00.0"


def test_affinity_alone_counts(tree: HostTree) -> None:
    cpus = usable_cpus(tree.view(affinity=range(8)))
    assert (cpus.count, cpus.how, cpus.quota) == (8, "affinity", None)


def test_v2_quota_binds_and_is_fractional(tree: HostTree) -> None:
    tree.cgroup_v2("/job.slice", cpu_max="150000 100000")
    cpus = usable_cpus(tree.view(affinity=range(16)))
    assert cpus.count == 1.5 and cpus.how == "cgroup v2 cpu.max"
    assert cpus.evidence["quota_raw"] == "150000 100000" and len(cpus.cpus) == 16


def test_v2_no_quota(tree: HostTree) -> None:
    tree.cgroup_v2("/", cpu_max="max 100000")
    assert usable_cpus(tree.view(affinity=range(4))).how == "affinity"


def test_v2_parent_quota_binds_the_child(tree: HostTree) -> None:
    tree.cgroup_v2("/kubepods/pod1/ctr", cpu_max="400000 100000")
    tree.write(tree.cgroup / "kubepods" / "pod1" / "cpu.max", "200000 100000\n")
    cpus = usable_cpus(tree.view(affinity=range(32)))
    assert cpus.count == 2.0 and cpus.quota is not None and cpus.quota.path.parent.name == "pod1"


def test_v2_cpuset_narrower_than_affinity(tree: HostTree) -> None:
    tree.cgroup_v2("/ctr", cpuset="0-3")
    cpus = usable_cpus(tree.view(affinity=range(16)))
    assert (cpus.count, cpus.how, cpus.cpus) == (4, "cpuset", frozenset(range(4)))


@pytest.mark.parametrize("cpu_dir", ["cpu,cpuacct", "cpu"])
def test_v1_quota(tree: HostTree, cpu_dir: str) -> None:
    tree.cgroup_v1("/docker/abc", quota_us=200000, period_us=100000, cpu_dir=cpu_dir)
    cpus = usable_cpus(tree.view(affinity=range(8)))
    assert cpus.count == 2.0 and cpus.how == "cgroup v1 cpu.cfs_quota_us"


def test_v1_no_quota_and_cpuset(tree: HostTree) -> None:
    tree.cgroup_v1("/", quota_us=-1, cpuset="2-5")
    cpus = usable_cpus(tree.view(affinity=range(8)))
    assert (cpus.count, cpus.how, cpus.cpus) == (4, "cpuset", frozenset({2, 3, 4, 5}))


def test_v1_container_sees_its_own_cgroup_as_the_root(tree: HostTree) -> None:
    # Docker without a cgroup namespace: /proc/self/cgroup names the host path, the files sit at the root.
    tree.cgroup_v1("/", quota_us=50000, period_us=100000)
    tree.write(tree.proc / "self" / "cgroup", "4:cpu,cpuacct:/docker/0123abcd\n0::/\n")
    assert usable_cpus(tree.view(affinity=range(8))).count == 0.5


def test_without_affinity_uses_online_cpus_never_cpu_count(tree: HostTree) -> None:
    tree.online("0-5")
    assert usable_cpus(tree.view()).count == 6
    nothing = usable_cpus(HostTree(tree.root / "empty").view())
    assert nothing.count is None
    assert cpus_check(tree.view(), nothing, 1, T).status == "skip"


def test_live_view_reads_this_machine() -> None:
    view = HostView.live()
    cpus = usable_cpus(view)
    assert cpus.count is not None and 0 < cpus.count <= len(os.sched_getaffinity(0))
    checks = host_checks(view, facts(0, error="no driver here"), T)
    assert {c.id for c in checks} >= {"host.shm_size", "host.usable_cpus", "host.memory", "host.environment"}


# --- usable CPUs per GPU -----------------------------------------------------------------------


def test_cpus_per_gpu(tree: HostTree) -> None:
    tree.cgroup_v2("/", cpu_max="400000 100000")
    view = tree.view(affinity=range(64))
    warn = cpus_check(view, usable_cpus(view), 4, T)
    assert warn.status == "warn" and warn.value == 4.0 and warn.unit == "count"
    assert "1.0 per GPU" in warn.detail and "--cpus=16" in (warn.fix or "") and "num_workers=1" in (warn.fix or "")
    assert 0 < warn.impact <= 0.6
    ok = cpus_check(view, usable_cpus(view), 1, T)
    assert ok.status == "ok" and ok.fix is None


# --- NUMA --------------------------------------------------------------------------------------


def two_sockets(tree: HostTree) -> None:
    tree.numa({0: "0-15", 1: "16-31"})
    tree.gpu(BDFS[0], 0)
    tree.gpu(BDFS[1], 1)


def test_gpu_numa_cpus(tree: HostTree) -> None:
    two_sockets(tree)
    view = tree.view(affinity=range(16))
    near = gpu_numa_cpus(view, "00000000:18:00.0")
    assert (near.node, near.cpus) == (0, frozenset(range(16)))
    far = gpu_numa_cpus(view, BDFS[1])
    assert far.node == 1 and far.node_cpus == frozenset(range(16, 32)) and far.cpus == frozenset()
    tree.gpu("0000:3b:00.0", -1)
    unknown = gpu_numa_cpus(view, "0000:3b:00.0")
    assert unknown.node is None and "numa_node -1" in (unknown.why or "")
    assert gpu_numa_cpus(view, "0000:99:00.0").why == "no /sys/bus/pci/devices/0000:99:00.0/numa_node"


def test_numa_one_check_per_gpu(tree: HostTree) -> None:
    two_sockets(tree)
    checks = numa_checks(tree.view(affinity=range(16)), facts(2))
    assert [(c.gpu, c.status) for c in checks] == [(0, "ok"), (1, "warn")]
    far = checks[1]
    assert far.value == 1 and "numactl --cpunodebind=1 --membind=1" in (far.fix or "")
    assert "--cpuset-cpus=16-31" in (far.fix or "") and far.evidence["usable_on_node"] == ""
    # A process that may run on both nodes reaches both GPUs' nodes.
    assert {c.status for c in numa_checks(tree.view(affinity=range(32)), facts(2))} == {"ok"}


def test_numa_skips(tree: HostTree) -> None:
    tree.numa({0: "0-7"})
    (single,) = numa_checks(tree.view(affinity=range(8)), facts(2))
    assert single.status == "skip" and "one NUMA node" in single.detail
    tree.numa({1: "8-15"})
    tree.gpu(BDFS[0], -1)
    tree.gpu(BDFS[1], 1)
    checks = numa_checks(tree.view(affinity=range(16)), facts(2))
    assert [(c.gpu, c.status) for c in checks] == [(0, "skip"), (1, "ok")]
    (none,) = numa_checks(tree.view(), facts(0, error="NVML: driver not loaded"))
    assert none.status == "skip" and "driver not loaded" in none.detail


# --- CPU governor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "governor", "epp", "status", "impact"),
    [
        ("acpi-cpufreq", "powersave", None, "warn", 0.5),
        ("intel_cpufreq", "powersave", None, "warn", 0.5),  # intel_pstate in passive mode: the generic governor
        ("intel_pstate", "powersave", "balance_performance", "ok", 0.0),
        ("intel_pstate", "powersave", "power", "warn", 0.15),
        ("amd-pstate-epp", "powersave", None, "ok", 0.0),
        ("acpi-cpufreq", "ondemand", None, "warn", 0.1),
        ("acpi-cpufreq", "conservative", None, "warn", 0.2),
        ("acpi-cpufreq", "schedutil", None, "ok", 0.0),
        ("intel_pstate", "performance", "performance", "ok", 0.0),
    ],
)
def test_governors(tree: HostTree, driver: str, governor: str, epp: str | None, status: str, impact: float) -> None:
    tree.governor(range(8), governor, driver, epp)
    view = tree.view(affinity=range(8))
    check = governor_check(view, usable_cpus(view))
    assert (check.status, check.impact, check.value) == (status, impact, governor)
    assert f"all 8 usable CPUs ({driver})" in check.detail
    if status == "warn":
        assert check.fix and (
            "cpupower frequency-set -g performance" in check.fix or "balance_performance" in check.fix
        )
    if driver == "intel_pstate" and governor == "powersave" and status == "ok":
        assert "not pinned low" in check.meaning


def test_governor_only_counts_usable_cpus(tree: HostTree) -> None:
    tree.governor(range(0, 2), "powersave", "acpi-cpufreq")
    tree.governor(range(2, 8), "performance", "acpi-cpufreq")
    tree.governor(range(8, 16), "powersave", "acpi-cpufreq")  # not ours
    view = tree.view(affinity=range(8))
    check = governor_check(view, usable_cpus(view))
    assert check.status == "warn" and check.detail == "powersave on 2 of 8 usable CPUs (acpi-cpufreq)"
    assert check.evidence["governors"] == {"acpi-cpufreq/powersave": "0-1", "acpi-cpufreq/performance": "2-7"}


def test_governor_skips_without_cpufreq(tree: HostTree) -> None:
    view = tree.view(affinity=range(4))
    check = governor_check(view, usable_cpus(view))
    assert check.status == "skip" and "no cpufreq" in check.detail


# --- memlock -----------------------------------------------------------------------------------


def test_memlock(tree: HostTree) -> None:
    assert memlock_check(tree.view(memlock=None), T).status == "skip"
    unlimited = memlock_check(tree.view(memlock=(None, None)), T)
    assert unlimited.status == "ok" and unlimited.detail == "memlock unlimited"
    small = (8 * MiB, 8 * MiB)
    no_rdma = memlock_check(tree.view(memlock=small), T)
    assert no_rdma.status == "ok" and "no RDMA" in no_rdma.detail and no_rdma.value == 8 * MiB
    tree.rdma("mlx5_0")
    warn = memlock_check(tree.view(memlock=small), T)
    assert warn.status == "warn" and "mlx5_0" in warn.detail and "--ulimit memlock=-1" in (warn.fix or "")
    assert "ulimit -l unlimited" not in (warn.fix or "")  # the hard limit forbids it
    raisable = memlock_check(tree.view(memlock=(8 * MiB, None)), T)
    assert "ulimit -l unlimited" in (raisable.fix or "")


# --- memory ------------------------------------------------------------------------------------


def test_memory_from_meminfo(tree: HostTree) -> None:
    tree.meminfo(total_mib=65536, available_mib=32768)
    ok = memory_check(tree.view(), T)
    assert ok.status == "ok" and ok.value == 32 * GiB and ok.unit == "bytes"
    tree.meminfo(total_mib=65536, available_mib=4096)
    low = memory_check(tree.view(), T)
    assert low.status == "warn" and "4.0GiB available of 64.0GiB" in low.detail and low.fix


def test_memory_against_pinned_buffers(tree: HostTree) -> None:
    tree.meminfo(total_mib=65536, available_mib=32768)
    assert memory_check(tree.view(), T, pinned_bytes=8 * GiB).status == "ok"
    assert memory_check(tree.view(), T, pinned_bytes=30 * GiB).status == "warn"
    fail = memory_check(tree.view(), T, pinned_bytes=40 * GiB)
    assert fail.status == "fail" and fail.evidence["headroom_bytes"] < 0 and "to pin" in fail.detail


def test_memory_under_a_cgroup_limit(tree: HostTree) -> None:
    tree.meminfo(total_mib=1024 * 1024, available_mib=900 * 1024)
    tree.cgroup_v2("/ctr", memory_max=str(8 * GiB), memory_current=int(7.8 * GiB), inactive_file=0)
    check = memory_check(tree.view(), T)
    assert check.status == "warn" and "(cgroup limit)" in check.detail and "8.0GiB" in check.detail
    # Reclaimable page cache counts as available, as docker stats counts it.
    tree.cgroup_v2("/ctr", memory_max=str(8 * GiB), memory_current=int(7.8 * GiB), inactive_file=4 * GiB)
    assert memory_check(tree.view(), T).status == "ok"


def test_memory_v1_without_a_limit(tree: HostTree) -> None:
    tree.meminfo(total_mib=65536, available_mib=32768)
    tree.cgroup_v1("/", memory_limit=9223372036854771712, memory_usage=60 * GiB)
    check = memory_check(tree.view(), T)
    assert check.status == "ok" and "cgroup" not in check.detail


def test_memory_skips_without_meminfo(tree: HostTree) -> None:
    assert memory_check(tree.view(), T).status == "skip"


# --- environment -------------------------------------------------------------------------------


def env_check(tree: HostTree, env: dict[str, str], gpus: int = 2, error: str | None = None) -> Check:
    view = tree.view(affinity=range(8), environ=env)
    return environment_check(view, facts(gpus, error), usable_cpus(view))


def test_clean_environment(tree: HostTree) -> None:
    check = env_check(tree, {"PATH": "/usr/bin", "CUDA_LAUNCH_BLOCKING": "0", "CUDA_VISIBLE_DEVICES": "1,0"})
    assert check.status == "ok" and check.value == {} and check.fix is None


@pytest.mark.parametrize(
    ("name", "value", "status"),
    [
        ("CUDA_LAUNCH_BLOCKING", "1", "warn"),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", "warn"),
        ("CUDA_CACHE_DISABLE", "1", "warn"),
        ("NCCL_P2P_DISABLE", "1", "warn"),
        ("NCCL_SHM_DISABLE", "1", "warn"),
        ("TORCH_CUDNN_V8_API_DISABLED", "1", "warn"),
        ("CUDA_DEVICE_MAX_CONNECTIONS", "1", "warn"),
        ("CUDA_MODULE_LOADING", "EAGER", "warn"),
        ("OMP_NUM_THREADS", "64", "warn"),
        ("OMP_NUM_THREADS", "8", "ok"),
        ("CUDA_VISIBLE_DEVICES", "", "fail"),
        ("CUDA_VISIBLE_DEVICES", "-1", "fail"),
        ("CUDA_VISIBLE_DEVICES", "5", "fail"),
        ("CUDA_VISIBLE_DEVICES", "GPU-deadbeef", "fail"),
        ("CUDA_VISIBLE_DEVICES", "\u0660", "fail"),  # not a digit CUDA reads: it hides every GPU
        ("CUDA_VISIBLE_DEVICES", "0,5,1", "warn"),
        ("CUDA_VISIBLE_DEVICES", "GPU-1aaa,0", "ok"),
        ("CUDA_VISIBLE_DEVICES", "MIG-3b2a1c0d-1111-2222-3333-444444444444", "ok"),
    ],
)
def test_each_variable(tree: HostTree, name: str, value: str, status: str) -> None:
    check = env_check(tree, {name: value})
    assert check.status == status, check.detail
    if status != "ok":
        assert check.detail == f"{name}={value!r}" and check.fix and name in check.fix and name in check.meaning
        assert check.value == {name: value}


def test_variables_that_need_context(tree: HostTree) -> None:
    # One GPU: NCCL's transports between GPUs do not matter.
    assert env_check(tree, {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, gpus=1).status == "ok"
    # GPUs unknown: CUDA_VISIBLE_DEVICES cannot be held against them.
    assert env_check(tree, {"CUDA_VISIBLE_DEVICES": "7"}, gpus=0, error="no driver").status == "ok"
    assert "OMP_NUM_THREADS=4" in (env_check(tree, {"OMP_NUM_THREADS": "64"}).fix or "")


def test_environment_findings_combine(tree: HostTree) -> None:
    check = env_check(tree, {"CUDA_CACHE_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "9", "CUDA_LAUNCH_BLOCKING": "1"})
    assert check.status == "fail" and check.impact == 1.0
    assert check.detail.startswith("CUDA_VISIBLE_DEVICES='9', CUDA_LAUNCH_BLOCKING='1'")
    assert set(check.evidence) == {"CUDA_CACHE_DISABLE", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING"}


# --- /dev/shm ----------------------------------------------------------------------------------


def test_shm_container_default_fails(tree: HostTree) -> None:
    check = shm_check(tree.view(statvfs=fake_statvfs(64 * MiB)), 1, T)
    assert check.status == "fail" and check.value == 64 * MiB and check.impact == 0.9
    assert check.detail == "64.0MiB free of 64.0MiB for 1 GPU"
    assert "--shm-size=16g" in (check.fix or "") and "--ipc=host" in (check.fix or "")
    assert "medium: Memory" in (check.fix or "") and "Bus error" in check.meaning


def test_shm_sizes(tree: HostTree) -> None:
    small = shm_check(tree.view(statvfs=fake_statvfs(2 * GiB)), 8, T)
    assert small.status == "warn" and small.evidence["warn_bytes"] == 8 * GiB
    assert shm_check(tree.view(statvfs=fake_statvfs(32 * GiB)), 8, T).status == "ok"
    assert shm_check(tree.view(statvfs=fake_statvfs(2 * GiB)), 0, T).status == "ok"  # 1 GiB at least, no GPU
    full = shm_check(tree.view(statvfs=fake_statvfs(32 * GiB, 100 * MiB)), 8, T)
    assert full.status == "fail" and "lsof +D /dev/shm" in (full.fix or "")
    busy = shm_check(tree.view(statvfs=fake_statvfs(32 * GiB, 4 * GiB)), 8, T)
    assert busy.status == "warn" and "du -sh /dev/shm" in (busy.fix or "")


def test_shm_unreadable_skips(tree: HostTree) -> None:
    def refuse(path: str) -> os.statvfs_result:
        raise PermissionError(13, "Permission denied", path)

    check = shm_check(tree.view(statvfs=refuse), 1, T)
    assert check.status == "skip" and "Permission denied" in check.detail


def test_a_missing_shm_fails(tree: HostTree) -> None:
    # Nowhere for shm_open to make the workers' buffers: torch's DataLoader stops at its first batch.
    missing = tree.root / "no-shm"
    check = shm_check(HostView(shm=missing, statvfs=os.statvfs), 1, T)
    assert (check.status, check.impact, check.evidence) == ("fail", 0.9, {"missing": True})
    assert check.detail == f"{missing} does not exist"
    assert f"sudo mkdir -p {missing} && sudo mount -t tmpfs -o size=16G tmpfs {missing}" in (check.fix or "")
    assert "num_workers=0" in (check.fix or "")
    # The size it says is the one the size check asks for: more GPUs, more room.
    many = shm_check(HostView(shm=missing, statvfs=os.statvfs), 32, T)
    wanted = max(16, math.ceil(32 * T.shm_warn_mib_per_gpu * MiB / GiB))
    assert wanted > 16 and f"size={wanted}G" in (many.fix or "") and f"--shm-size={wanted}g" in (many.fix or "")


def test_a_shm_that_links_to_nothing_fails_naming_where_it_points(tree: HostTree) -> None:
    link = tree.root / "shm-link"
    link.symlink_to("run/shm")  # relative, as /dev/shm -> /run/shm is
    check = shm_check(HostView(shm=link, statvfs=os.statvfs), 1, T)
    target = tree.root / "run" / "shm"
    assert check.status == "fail" and check.detail == f"{link} links to {target}, which does not exist"
    assert f"sudo mkdir -p {target} && sudo mount" in (check.fix or "")


def test_shm_on_a_real_64_mib_tmpfs(tree: HostTree, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "shm", 64) as shm:
        check = shm_check(HostView(shm=shm, statvfs=os.statvfs), 1, T)
    assert check.status == "fail" and check.value == 64 * MiB, check.detail


def test_a_read_only_shm_fails_however_large(tree: HostTree) -> None:
    # Workers cannot create their shared buffers there: torch's DataLoader stops with EROFS at its start.
    check = shm_check(tree.view(statvfs=fake_statvfs(32 * GiB, flag=os.ST_RDONLY)), 1, T)
    assert check.status == "fail" and check.impact == 0.9 and check.evidence["read_only"] is True
    assert check.detail.endswith(", read-only") and "read-only" in check.meaning
    assert "remount,rw" in (check.fix or "") and "num_workers=0" in (check.fix or "")


def test_a_real_read_only_tmpfs_fails(tree: HostTree, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "shm", 1024, "ro") as shm:
        check = shm_check(HostView(shm=shm, statvfs=os.statvfs), 1, T)
    assert check.status == "fail" and "read-only" in check.detail, check.detail


# --- all of them -------------------------------------------------------------------------------


def test_host_checks_on_a_fake_box(tree: HostTree) -> None:
    two_sockets(tree)
    tree.online("0-31")
    tree.cgroup_v2("/ctr", cpu_max="400000 100000")
    tree.governor(range(32), "powersave", "acpi-cpufreq")
    tree.meminfo(total_mib=65536, available_mib=32768)
    env = {"CUDA_LAUNCH_BLOCKING": "1"}
    checks = host_checks(tree.view(affinity=range(16), environ=env, statvfs=fake_statvfs(64 * MiB)), facts(2), T)
    by = {(c.id, c.gpu): c for c in checks}
    assert [c.id for c in checks] == [
        "host.shm_size",
        "host.usable_cpus",
        "host.numa",
        "host.numa",
        "host.cpu_governor",
        "host.memlock",
        "host.memory",
        "host.environment",
    ]
    assert by[("host.shm_size", None)].status == "fail"
    assert by[("host.usable_cpus", None)].status == "warn"
    assert (by[("host.numa", 0)].status, by[("host.numa", 1)].status) == ("ok", "warn")
    assert by[("host.cpu_governor", None)].status == "warn"
    assert by[("host.environment", None)].status == "warn"
    for check in checks:
        assert check.category == "host" and 0 <= check.impact <= 1
        if check.status != "skip":
            assert check.meaning and check.detail
        if check.status in ("warn", "fail"):
            assert check.fix and check.impact > 0


def test_one_unreadable_check_costs_only_itself(tree: HostTree) -> None:
    tree.write(tree.proc / "meminfo", "MemTotal: lots kB\n")

    def broken(path: str) -> os.statvfs_result:
        raise ValueError("odd answer")

    checks = host_checks(tree.view(affinity=range(4), statvfs=broken), facts(1), T)
    shm = next(c for c in checks if c.id == "host.shm_size")
    assert shm.status == "skip" and "odd answer" in shm.detail
    assert len(checks) == 7


def test_few_cpus_pinned_or_on_a_small_box(tree: HostTree) -> None:
    tree.online("0-7")
    pinned = tree.view(affinity={0, 1})
    assert "pinned" in (cpus_check(pinned, usable_cpus(pinned), 2, T).fix or "")
    small = tree.view(affinity=range(8))
    assert "The box has 8 CPUs for 4 GPUs" in (cpus_check(small, usable_cpus(small), 4, T).fix or "")


def test_garbled_cpuset_costs_only_the_cpu_checks(tree: HostTree) -> None:
    tree.cgroup_v2("/", cpuset="zero-three")
    checks = host_checks(tree.view(affinity=range(4)), facts(1), T)
    cpus = next(c for c in checks if c.id == "host.usable_cpus")
    assert cpus.status == "skip" and "unreadable" in cpus.detail
    assert next(c for c in checks if c.id == "host.environment").status == "ok"


def test_a_check_whose_read_hangs_costs_that_check_only(tree: HostTree, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import gpubox.doctor.host_checks as host_checks_module

    release = threading.Event()

    def stuck_statvfs(path: str) -> os.statvfs_result:  # /dev/shm on a stale mount
        release.wait()
        return fake_statvfs(16 * 1024 * MiB)(path)

    monkeypatch.setattr(host_checks_module, "CHECK_TIMEOUT_S", 0.05)
    try:
        checks = {c.id: c for c in host_checks(tree.view(statvfs=stuck_statvfs), facts(), Thresholds())}
    finally:
        release.set()
    assert checks["host.shm_size"].status == "warn" and "did not finish within 0.05 s" in checks["host.shm_size"].detail
    others = [c for id, c in checks.items() if id != "host.shm_size"]
    assert len(others) >= 5 and not any("did not finish" in c.detail for c in others)


def test_only_host_does_not_count_copy_buffers_it_never_allocates(tree: HostTree, nvml: Any) -> None:
    # 300 MiB available: too little for the copy benchmark's 512 MiB, but `--only host` runs no copies,
    # so the memory check must not fail for them.
    tree.meminfo(total_mib=2048, available_mib=300)
    sources = Sources(nvml=nvml(scenarios.healthy(1)), host_view=tree.view(affinity=range(8)), env={})
    report, _ = examine(DoctorOptions(only=frozenset({"host"})), T, sources)
    memory = next(c for c in report.checks if c.id == "host.memory")
    assert memory.status == "ok", memory.detail
    assert memory.evidence["pinned_bytes"] == 0 and "to pin" not in memory.detail
