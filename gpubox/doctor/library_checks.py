"""The driver and torch, checked against each other and against the GPUs (category "driver"):
NVML present, the driver's CUDA against torch's CUDA build, torch's kernels for each GPU's
architecture, and a CUDA build of torch at all. Pure functions of `SystemFacts` and `TorchFacts`
(torch_facts.py: what torch_bench.py facts says about the training environment's torch).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpubox.doctor.model import Check, SystemFacts, skipped
from gpubox.doctor.torch_facts import TorchFacts
from gpubox.telemetry.model import Reason

# Minimum driver per CUDA major under minor-version compatibility (NVIDIA, CUDA Compatibility guide, table 1):
# a torch built for any 12.x runs on >= 525.60.13, with limits (no PTX JIT of newer PTX, some features missing).
MINOR_COMPAT_DRIVER: Mapping[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# The driver each toolkit shipped with (CUDA Toolkit release notes, table 3, Linux x86_64): all features and PTX JIT.
TOOLKIT_DRIVER: Mapping[tuple[int, int], str] = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# CUDA versions of the wheel indexes at download.pytorch.org/whl/cuXYZ, newest first
TORCH_WHEEL_CUDA: tuple[tuple[int, int], ...] = ((13, 0), (12, 9), (12, 8), (12, 6), (12, 4), (12, 1), (11, 8))
BLACKWELL_CUDA = (12, 8)  # the first CUDA with sm_100 and sm_120
LEGACY_CUDA = (12, 6)  # the newest wheels that still carry Maxwell, Pascal and Volta (below sm_75) kernels
NO_KERNEL = "no kernel image is available for execution on the device"


def library_checks(facts: SystemFacts, torch: TorchFacts | None) -> list[Check]:
    """The "driver" checks: driver.nvml, driver.torch_build, driver.cuda_vs_torch, and driver.arch per GPU."""
    torch = torch or TorchFacts.unavailable("torch was not looked at in this run")
    return [
        nvml_check(facts),
        torch_build_check(facts, torch),
        cuda_vs_torch_check(facts, torch),
        *arch_checks(facts, torch),
    ]


def nvml_check(facts: SystemFacts) -> Check:
    check_id, title = "driver.nvml", "NVIDIA driver (NVML)"
    if facts.nvml_error is None:
        cuda = f", CUDA {_cuda_text(facts.cuda_driver_version)}" if facts.cuda_driver_version else ""
        lost = [g.index for g in facts.gpus if Reason.GPU_LOST.value in g.missing.values()]
        if lost:
            return _lost_check(facts, cuda, lost)
        return Check(
            id=check_id,
            title=title,
            category="driver",
            status="ok",
            detail=f"driver {facts.driver_version or '?'}{cuda}, {len(facts.gpus)} GPU(s)",
            value=facts.driver_version,
            meaning="NVML, the driver's management library, answers: gpubox, nvidia-smi and monitoring see the GPUs.",
        )
    if not facts.nvidia_devices:
        return skipped(check_id, title, "driver", f"no NVIDIA GPU on this box ({facts.nvml_error.rstrip('.')})")
    error = facts.nvml_error
    if "mismatch" in error.lower():
        fix = "The driver was updated but the old kernel module is still loaded: reboot (or reload the nvidia modules)"
        impact = 1.0  # CUDA fails the same way
    elif "permission" in error.lower():
        fix = "Give this user access to /dev/nvidia* (often the video group), or run as root"
        impact = 0.5
    else:
        fix = (
            "Install the user-space part of the NVIDIA driver that matches its kernel module (libnvidia-ml.so.1); "
            "in a container, start it under the NVIDIA Container Toolkit (docker run --gpus all)"
        )
        impact = 0.5
    return Check(
        id=check_id,
        title=title,
        category="driver",
        status="fail",
        detail=f"NVML cannot be read ({error}), though the kernel has NVIDIA GPUs",
        meaning="Without NVML nothing can watch the GPUs (gpubox, nvidia-smi, monitoring), and CUDA often fails too.",
        fix=fix,
        impact=impact,
        evidence={"nvml_error": error, "nvidia_devices": True},
    )


def _lost_check(facts: SystemFacts, cuda: str, lost: list[int]) -> Check:
    """NVML answers, but a GPU it lists has fallen off the bus: every other check of that GPU can only
    skip, so this is where the run fails for it."""
    which = ", ".join(map(str, lost))
    many = len(lost) > 1
    gpus = f"GPU{'s' if many else ''} {which}"
    return Check(
        id="driver.nvml",
        title="NVIDIA driver (NVML)",
        category="driver",
        status="fail",
        detail=f"driver {facts.driver_version or '?'}{cuda}, {len(facts.gpus)} GPU(s); {gpus} fell off the bus",
        value=facts.driver_version,
        meaning=(
            f"NVML answers that {gpus} {'are' if many else 'is'} lost (Xid 79): no process can use "
            f"{'them' if many else 'it'} until the box is rebooted, and the other checks of {gpus} cannot run."
        ),
        fix=(
            "sudo dmesg | grep -i xid shows when it fell off; reboot to bring it back. If it happens again, "
            "reseat the GPU and check its power cables, its cooling and the slot's PCIe speed in the BIOS"
        ),
        impact=1.0,
        evidence={"lost_gpus": lost},
    )


def torch_build_check(facts: SystemFacts, torch: TorchFacts) -> Check:
    check_id, title = "driver.torch_build", "torch's CUDA build"
    gpus = len(facts.gpus) or (1 if facts.nvidia_devices else 0)
    if torch.torch_broken and gpus:
        return _broken_torch_check(facts, torch)
    if torch.torch_error is not None:
        return skipped(check_id, title, "driver", torch.torch_error)
    evidence = {
        "torch_version": torch.torch_version,
        "cuda_build": torch.cuda_build,
        "cuda_available": torch.cuda_available,
        "cuda_error": torch.cuda_error,
        "cuda_visible_devices": torch.cuda_visible_devices,
        "python": torch.python,
    }
    if gpus == 0:
        return skipped(check_id, title, "driver", "no NVIDIA GPU on this box")
    box = f"{len(facts.gpus)} NVIDIA GPU(s)" if facts.gpus else "NVIDIA GPUs"
    if torch.cuda_build is None:
        where = torch.python or "this environment"
        kind = f"a ROCm (AMD) build, HIP {torch.hip_build}" if torch.hip_build else "a CPU-only build"
        return Check(
            id=check_id,
            title=title,
            category="driver",
            status="fail",
            detail=f"torch {torch.torch_version} in {where} is {kind}, on a box with {box}",
            meaning="This torch cannot use the GPUs: everything runs on the CPU.",
            fix=_install_line(facts, torch),
            impact=1.0,
            evidence=evidence,
        )
    if torch.cuda_available:
        visible = (
            f" (CUDA_VISIBLE_DEVICES={torch.cuda_visible_devices})" if torch.cuda_visible_devices is not None else ""
        )
        return Check(
            id=check_id,
            title=title,
            category="driver",
            status="ok",
            detail=f"torch {torch.torch_version} for CUDA {torch.cuda_build} sees {torch.device_count} GPU(s){visible}",
            value=torch.torch_version,
            meaning="torch can use the GPUs.",
            evidence=evidence,
        )
    hidden = torch.cuda_visible_devices is not None and torch.cuda_visible_devices.strip() in ("", "-1", "none", "void")
    if hidden:
        fix = f"CUDA_VISIBLE_DEVICES={torch.cuda_visible_devices!r} hides every GPU: unset it or name the GPUs to use"
    elif _driver_too_old(facts, torch):
        fix = "The driver is too old for this torch build: see driver.cuda_vs_torch"
    else:
        fix = (
            "Check that the training environment sees /dev/nvidia* (in a container: --gpus all) and that "
            "`python -c 'import torch; torch.cuda.init()'` works there"
        )
    return Check(
        id=check_id,
        title=title,
        category="driver",
        status="fail",
        detail=f"torch {torch.torch_version} for CUDA {torch.cuda_build} cannot use CUDA: {torch.cuda_error}",
        meaning="This torch cannot use the GPUs: everything runs on the CPU.",
        fix=fix,
        impact=1.0,
        evidence=evidence,
    )


def _broken_torch_check(facts: SystemFacts, torch: TorchFacts) -> Check:
    """torch is there but its import fails (a missing CUDA library, a half-finished upgrade): every job
    that imports it stops, so this fails where a torch that is not installed (another interpreter?) skips."""
    python = shlex.quote(torch.python) if torch.python else "python"
    return Check(
        id="driver.torch_build",
        title="torch's CUDA build",
        category="driver",
        status="fail",
        detail=torch.torch_error or "torch is installed but cannot be imported",
        meaning="Every job that imports torch in this environment stops before it starts.",
        fix=f"`{python} -c 'import torch'` shows the whole error; reinstall it: {_install_line(facts, torch)}",
        impact=1.0,
        evidence={"python": torch.python, "torch_error": torch.torch_error},
    )


def cuda_vs_torch_check(facts: SystemFacts, torch: TorchFacts) -> Check:
    check_id, title = "driver.cuda_vs_torch", "Driver's CUDA against torch's"
    if torch.torch_error is not None:
        return skipped(check_id, title, "driver", torch.torch_error)
    if torch.cuda_build is None:
        return skipped(
            check_id, title, "driver", f"torch {torch.torch_version} has no CUDA build (see driver.torch_build)"
        )
    built = _version(torch.cuda_build)
    if built is None:
        return skipped(check_id, title, "driver", f"torch's CUDA version {torch.cuda_build!r} is not understood")
    if facts.cuda_driver_version is None:
        why = f" ({facts.nvml_error.rstrip('.')})" if facts.nvml_error else ""
        return skipped(check_id, title, "driver", f"the driver's CUDA version is unknown{why}")
    driver = (facts.cuda_driver_version // 1000, facts.cuda_driver_version % 1000 // 10)
    evidence = {
        "driver_version": facts.driver_version,
        "driver_cuda": _cuda_text(facts.cuda_driver_version),
        "torch_cuda": torch.cuda_build,
        "minor_compat_min_driver": MINOR_COMPAT_DRIVER.get(built[0]),
        "toolkit_driver": TOOLKIT_DRIVER.get(built),
    }
    said = (
        f"torch {torch.torch_version} is built for CUDA {torch.cuda_build}; driver {facts.driver_version or '?'} "
        f"supports CUDA {driver[0]}.{driver[1]}"
    )
    base = Check(
        id=check_id, title=title, category="driver", status="ok", detail=said, value=torch.cuda_build, evidence=evidence
    )
    if built <= driver:
        return _with(base, meaning="The driver runs everything this torch build asks of it.")
    minimum = MINOR_COMPAT_DRIVER.get(built[0])
    shipped = TOOLKIT_DRIVER.get(built)
    full = f"≥ {shipped}" if shipped else f"the release that came with CUDA {built[0]}.{built[1]}"
    if minimum is None or built[0] > driver[0] or _older(facts.driver_version, minimum):
        need = (
            full
            if minimum is None or shipped == minimum
            else f"≥ {minimum} (for any CUDA {built[0]}.x; {full} for all of CUDA {built[0]}.{built[1]})"
        )
        return _with(
            base,
            status="fail",
            meaning=(
                "torch cannot initialise CUDA ('the NVIDIA driver on your system is too old'): a driver runs CUDA "
                "builds of its own major version and older ones."
            ),
            fix=f"Upgrade the NVIDIA driver to {need}{_or_wheel(facts, torch)}",
            impact=1.0,
        )
    sass_everywhere = all(
        _kernels(cap, torch.arch_list)[0] in ("native", "compatible") for cap in _capabilities(facts, torch)
    )
    meaning = (
        f"It runs under CUDA minor-version compatibility (driver ≥ {minimum}), with limits: the driver cannot "
        f"JIT-compile PTX from CUDA {torch.cuda_build}, and features that need a newer driver are missing."
    )
    if sass_everywhere:
        return _with(base, meaning=meaning + " Every GPU here has native kernels in this build, so none needs PTX JIT.")
    return _with(
        base,
        status="warn",
        meaning=meaning + " Some GPU here has only PTX in this build (see driver.arch), and that PTX will not load.",
        fix=f"Upgrade the NVIDIA driver to {full}{_or_wheel(facts, torch)}",
        impact=0.5,
    )


def arch_checks(facts: SystemFacts, torch: TorchFacts) -> list[Check]:
    """driver.arch for each GPU: does torch carry kernels for its compute capability?"""
    title = "torch kernels for the GPU"
    why = None
    if torch.torch_error is not None:
        why = torch.torch_error
    elif torch.cuda_build is None:
        why = f"torch {torch.torch_version} has no CUDA build (see driver.torch_build)"
    elif not torch.arch_list:
        why = f"torch did not list the GPU architectures it was built for ({torch.cuda_error or 'no reason given'})"
    gpus = _gpus(facts, torch)
    if not gpus and why is None:
        why = "no GPU's compute capability is known" if facts.gpus else "no NVIDIA GPU on this box"
    if why is not None:
        indexes: list[int | None] = [g for g, _, _ in gpus] or [None]
        return [skipped("driver.arch", title, "driver", why, gpu) for gpu in indexes]
    return [_arch_check(index, name, cap, facts, torch) for index, name, cap in gpus]


def _arch_check(index: int, name: str, cap: tuple[int, int], facts: SystemFacts, torch: TorchFacts) -> Check:
    sm = f"sm_{cap[0]}{cap[1]}"
    kind, used = _kernels(cap, torch.arch_list)
    base = Check(
        id="driver.arch",
        title="torch kernels for the GPU",
        category="driver",
        status="ok",
        detail="",
        value=sm,
        gpu=index,
        evidence={"capability": f"{cap[0]}.{cap[1]}", "arch_list": list(torch.arch_list), "uses": used},
    )
    who = f"{name} (compute capability {cap[0]}.{cap[1]})"
    built = f"torch {torch.torch_version} has {' '.join(torch.arch_list)}"
    if kind == "native":
        return _with(
            base, detail=f"{built}: {used} kernels for {who}", meaning="torch runs its own kernels for this GPU."
        )
    if kind == "compatible":
        return _with(
            base,
            detail=f"{built}: {who} runs its {used} kernels (binary-compatible within {cap[0]}.x)",
            meaning="torch's kernels for an earlier GPU of the same generation run on this one unchanged.",
        )
    fix = f"Install a torch built with {sm}: {_install_line(facts, torch, [cap])}"
    if kind == "ptx":
        return _with(
            base,
            status="warn",
            detail=f"{built}: no {sm} kernels for {who}, only {used} PTX that the driver compiles at first use",
            meaning=(
                "The first start JIT-compiles every kernel (minutes; cached in ~/.nv/ComputeCache), and it fails "
                "when the driver is older than the CUDA this torch was built with."
            ),
            fix=fix,
            impact=0.3,
        )
    oldest = min((p[1] for a in torch.arch_list if (p := _arch(a)) is not None and p[0] == "sm"), default=None)
    if oldest is not None and cap < oldest:
        fix = (
            f"This torch no longer builds for {sm}: install an older torch that does, or build torch "
            f"with TORCH_CUDA_ARCH_LIST={cap[0]}.{cap[1]}"
        )
    return _with(
        base,
        status="fail",
        detail=f"{built}: nothing for {who}",
        meaning=f"Every CUDA operation fails with '{NO_KERNEL}'.",
        fix=fix,
        impact=1.0,
    )


_ARCH = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


def _arch(entry: str) -> tuple[str, tuple[int, int], str] | None:
    """("sm" or "compute", (major, minor), "" or "a" or "f") from "sm_90a"; None when not understood."""
    match = _ARCH.match(entry.strip())
    if match is None:
        return None
    return match.group(1), (int(match.group(2)), int(match.group(3))), match.group(4)


def _kernels(cap: tuple[int, int], arch_list: Sequence[str]) -> tuple[str, str | None]:
    """How a GPU of capability CAP runs this build: "native" (sm_XY for it), "compatible" (an earlier
    sm of the same major: cubins run on later minors), "ptx" (compute_XY at or below it, JIT-compiled),
    or "missing"; with the entry used."""
    parsed = [(entry, p) for entry in arch_list if (p := _arch(entry)) is not None]
    for entry, (kind, version, _) in parsed:
        if kind == "sm" and version == cap:
            return "native", entry
    # "a" (arch-specific) code runs only on its exact capability
    same_major = [(v, e) for e, (k, v, s) in parsed if k == "sm" and s != "a" and v[0] == cap[0] and v < cap]
    if same_major:
        return "compatible", max(same_major)[1]
    # PTX is forward-compatible to any later GPU, except arch- and family-specific PTX
    ptx = [
        (v, e) for e, (k, v, s) in parsed if k == "compute" and v <= cap and (s == "" or (s == "f" and v[0] == cap[0]))
    ]
    if ptx:
        return "ptx", max(ptx)[1]
    return "missing", None


def _gpus(facts: SystemFacts, torch: TorchFacts) -> list[tuple[int, str, tuple[int, int]]]:
    """(index, name, capability) per GPU: NVML's, whose indexes the report uses; torch's when NVML has none."""
    from_nvml = [(g.index, g.name, g.compute_capability) for g in facts.gpus if g.compute_capability is not None]
    if from_nvml:
        return from_nvml
    return [(d.index, d.name, d.capability) for d in torch.devices if d.capability is not None]


def _capabilities(facts: SystemFacts, torch: TorchFacts) -> list[tuple[int, int]]:
    return [cap for _, _, cap in _gpus(facts, torch)]


def _install_line(facts: SystemFacts, torch: TorchFacts, caps: Sequence[tuple[int, int]] | None = None) -> str:
    """`pip install torch` from the newest wheel index that the driver runs and the GPUs need (at most
    the driver's own CUDA version, so no minor-version compatibility limits apply); a driver too old
    for any of them is to be upgraded first."""
    wheel, need = _wheel(facts, caps)
    if wheel is None:
        return (
            f"upgrade the NVIDIA driver to ≥ {TOOLKIT_DRIVER[need]} (CUDA {need[0]}.{need[1]}), "
            f"then {_pip(need, torch)}"
        )
    return _pip(wheel, torch)


def _wheel(
    facts: SystemFacts, caps: Sequence[tuple[int, int]] | None = None
) -> tuple[tuple[int, int] | None, tuple[int, int]]:
    """(the newest wheel CUDA the driver runs and the GPUs need, or None; the oldest the GPUs need)."""
    if caps is None:
        caps = [g.compute_capability for g in facts.gpus if g.compute_capability is not None]
    need = BLACKWELL_CUDA if any(c[0] >= 10 for c in caps) else TORCH_WHEEL_CUDA[-1]
    ceiling = LEGACY_CUDA if any(c < (7, 5) for c in caps) and need <= LEGACY_CUDA else None
    driver = _driver_cuda(facts)
    usable = [
        v
        for v in TORCH_WHEEL_CUDA
        if v >= need and (driver is None or v <= driver) and (ceiling is None or v <= ceiling)
    ]
    return (usable[0] if usable else None), need


def _or_wheel(facts: SystemFacts, torch: TorchFacts) -> str:
    wheel, _ = _wheel(facts)
    return f", or install a torch built for the driver's CUDA: {_pip(wheel, torch)}" if wheel else ""


def _pip(cuda: tuple[int, int], torch: TorchFacts) -> str:
    """The install into the interpreter that was checked. A torch is installed whenever this is said, and
    any installed torch satisfies `pip install torch` (a +cpu build too): only a forced reinstall replaces it."""
    python = shlex.quote(torch.python) if torch.python else "python"
    return (
        f"{python} -m pip install --force-reinstall torch "
        f"--index-url https://download.pytorch.org/whl/cu{cuda[0]}{cuda[1]}"
    )


def _driver_cuda(facts: SystemFacts) -> tuple[int, int] | None:
    version = facts.cuda_driver_version
    return (version // 1000, version % 1000 // 10) if version else None


def _driver_too_old(facts: SystemFacts, torch: TorchFacts) -> bool:
    built = _version(torch.cuda_build)
    if built is None or facts.cuda_driver_version is None:
        return False
    return built[0] > facts.cuda_driver_version // 1000


def _version(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _older(driver: str | None, minimum: str) -> bool:
    """True when the driver version (as "550.54.15") is below minimum; unknown counts as not older."""
    have, need = _numbers(driver), _numbers(minimum)
    return bool(have) and have < need


def _numbers(version: str | None) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version or "")
    return tuple(int(p) for p in parts)


def _cuda_text(version: int | None) -> str:
    return "?" if version is None else f"{version // 1000}.{version % 1000 // 10}"


def _with(check: Check, **changes: Any) -> Check:
    return replace(check, **changes)
