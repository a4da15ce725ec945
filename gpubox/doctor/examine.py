"""One doctor run: read the facts, run each group of checks within its time limit, benchmark
copies to each chosen GPU while sampling its link, and assemble the report."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubox.digits import ascii_int
from gpubox.doctor.findings import NO_GPU_NOTE, DoctorReport, exit_code, make_report
from gpubox.doctor.guard import TimedOut, guarded, within
from gpubox.doctor.model import CATEGORIES, GPU_CATEGORIES, Check, LinkSample, SystemFacts
from gpubox.doctor.thresholds import Thresholds
from gpubox.doctor.torch_facts import TorchFacts
from gpubox.exit_codes import ExitCode, GpuboxError

GROUPS = tuple(c for c in CATEGORIES if c != "loader")  # `doctor loader` is a command of its own
FACTS_TIMEOUT_S = 20.0
TORCH_TIMEOUT_S = 90.0  # importing torch and starting CUDA can take most of a minute on a cold disk
HOST_TIMEOUT_S = 20.0
DATA_TIMEOUT_S = {"quick": 60.0, "full": 300.0}


@dataclass(frozen=True)
class DoctorOptions:
    mode: str = "quick"  # "quick" or "full"
    python: str = sys.executable
    data: Path | None = None
    only: frozenset[str] = frozenset()  # empty: every group
    gpus: tuple[int, ...] | None = None  # GPUs to benchmark; None: the mode's default

    @classmethod
    def parse(
        cls, mode: str, python: str | None, data: str | Path | None, only: str | None, gpus: str | None
    ) -> DoctorOptions:
        """Options from the command line; a bad one is a usage error that names it."""
        if isinstance(data, str) and not data.strip():  # Path("") is the current directory: it would measure that
            raise GpuboxError(f"--data {data!r}: an empty path", ExitCode.USAGE)
        dataset = None if data is None else Path(data)
        groups = frozenset(g.strip().lower() for g in (only or "").split(",") if g.strip())
        unknown = sorted(groups - set(GROUPS))
        if unknown:
            raise GpuboxError(f"--only: unknown group {unknown[0]!r}; known: {', '.join(GROUPS)}", ExitCode.USAGE)
        if only is not None and not groups:
            raise GpuboxError("--only: name at least one group", ExitCode.USAGE)
        if data is not None and groups:
            groups = groups | {"data"}  # --data asks for the data group by itself
        if "data" in groups and data is None:
            raise GpuboxError("--only data: name the dataset with --data PATH", ExitCode.USAGE)
        chosen: tuple[int, ...] | None = None
        if gpus is not None:
            items = [g.strip() for g in gpus.split(",")]
            if any(g.startswith("-") and ascii_int(g[1:]) is not None for g in items):
                raise GpuboxError(f"--gpu: GPU indexes start at 0, got {gpus!r}", ExitCode.USAGE)
            indexes = [ascii_int(g) for g in items]  # as CUDA reads an index
            if None in indexes:
                raise GpuboxError(f"--gpu: expected GPU indexes such as 0,2, got {gpus!r}", ExitCode.USAGE)
            # a GPU named twice is benchmarked once: twice would double the run and repeat its checks
            chosen = tuple(dict.fromkeys(i for i in indexes if i is not None))
        interpreter = sys.executable
        if python is not None:
            from gpubox.doctor.interpreter import check_interpreter

            interpreter = check_interpreter(python)
        if dataset is not None:
            _check_dataset(dataset)
        return cls(mode=mode, python=interpreter, data=dataset, only=groups, gpus=chosen)

    def wants(self, group: str) -> bool:
        return not self.only or group in self.only


def _check_dataset(data: Path) -> None:
    """A path with nothing to read is a usage error now, not a warning later; a listing that hangs (a
    stalled network mount) is an error after a while, not a hang."""
    from gpubox.doctor.data_checks import sample_files

    try:
        within(DATA_TIMEOUT_S["quick"], lambda: sample_files(data))
    except TimedOut as exc:
        raise GpuboxError(f"--data: listing {data} {exc} (a stalled network mount?)", ExitCode.FAILED) from None


@dataclass
class Sources:
    """Where the facts come from; tests pass a pynvml module on the fake library and a fake host."""

    nvml: Any = None  # an initialised pynvml; None: load NVML here (and shut it down after)
    host_view: Any = None  # a HostView; None: this machine's
    clock: Callable[[], float] = time.monotonic
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def examine(options: DoctorOptions, t: Thresholds, sources: Sources | None = None) -> tuple[DoctorReport, ExitCode]:
    src = sources or Sources()
    started = src.clock()
    nvml, owned = _open_nvml(src.nvml)
    try:
        return _examine(options, t, src, nvml, started)
    finally:
        if owned:
            with suppress(Exception):  # a library that misbehaves on the way out is not worth a failure
                nvml.nvmlShutdown()


def _examine(
    options: DoctorOptions, t: Thresholds, src: Sources, nvml: Any, started: float
) -> tuple[DoctorReport, ExitCode]:
    checks: list[Check] = []
    notes: list[str] = []
    benchmarks: dict[str, Any] = {}
    facts = _facts(nvml)
    gpu_work = any(options.wants(g) for g in ("transfer", "gpu", "pcie"))
    # --gpu asks for GPU checks only where a GPU group runs: with --only host, it has nothing to
    # pick, on a box with GPUs or without.
    gpus_named = options.gpus is not None and (not options.only or bool(options.only & GPU_CATEGORIES))
    # A bad --gpu stops the run before any work.
    chosen = _chosen_gpus(options, facts) if facts.gpus and (gpus_named or options.gpus is None) else []
    no_gpu_but_asked = bool(options.only & GPU_CATEGORIES or gpus_named) and not facts.gpus
    torch: TorchFacts | None = None
    if options.wants("driver") or options.wants("transfer"):
        from gpubox.doctor.torch_facts import read_torch_facts

        torch = read_torch_facts(options.python, timeout_s=TORCH_TIMEOUT_S)
    if options.wants("driver"):
        checks += guarded("driver", "Driver and libraries", "driver", FACTS_TIMEOUT_S, lambda: _library(facts, torch))
    view = src.host_view
    if view is None and (options.wants("host") or options.wants("transfer")):
        from gpubox.doctor.host_view import HostView

        view = HostView.live()
    if options.wants("host"):
        # only buffers this run allocates count against memory: none unless the copies run
        copying = bool(chosen) and options.wants("transfer")
        checks += guarded("host", "Host", "host", HOST_TIMEOUT_S, lambda: _host(view, facts, t, copying))
    samples: list[LinkSample] = []
    if options.wants("transfer"):
        from gpubox.doctor.transfer_run import run_transfers

        run = run_transfers(
            python=options.python,
            mode=options.mode,
            facts=facts,
            torch=torch,
            t=t,
            gpus=chosen,
            nvml=nvml,
            view=view,
            samples=samples,
            env=src.env,
        )
        checks += run.checks
        notes += run.notes
        benchmarks["transfer"] = list(run.results)
    else:
        benchmarks["transfer"] = None  # a stable key: null when the copies were not asked for
    if options.wants("gpu") or options.wants("pcie"):
        gpu_part = guarded("gpu", "GPU health", "gpu", FACTS_TIMEOUT_S, lambda: _gpu(facts, samples, t))
        checks += [c for c in gpu_part if options.wants(c.category) or c.id.endswith(".error")]
    if options.data is not None and options.wants("data"):
        data = options.data
        checks += guarded("data", "Dataset reads", "data", DATA_TIMEOUT_S[options.mode], lambda: _data(data, t, view))
    if no_gpu_but_asked:
        notes.append(f"{NO_GPU_NOTE}: {facts.nvml_error or 'NVML lists none'}")
    elif gpu_work and not facts.gpus:
        why = (facts.nvml_error or "NVML lists none").rstrip(".")  # a sentence, here inside brackets
        notes.append(f"no GPU found ({why}): the GPU checks are skipped")
    report = make_report(
        "doctor",
        options.mode,
        checks,
        benchmarks,
        {"system": facts, "torch": torch, "python": options.python, "samples": len(samples)},
        src.clock() - started,
        notes,
    )
    return report, exit_code(checks, no_gpu_but_asked)


def _open_nvml(given: Any) -> tuple[Any, bool]:
    """One NVML session for the facts and the link samples, so counters run on between them."""
    if given is not None:
        return given, False
    from gpubox.telemetry.backend import BackendUnavailable
    from gpubox.telemetry.nvml_load import load_nvml

    try:
        return within(FACTS_TIMEOUT_S, load_nvml), True
    except (BackendUnavailable, TimedOut):
        return None, False  # read_facts(None) tries again and says why in one sentence


def _facts(nvml: Any) -> SystemFacts:
    from gpubox.doctor.nvml_facts import read_facts

    try:
        return within(FACTS_TIMEOUT_S, lambda: read_facts(nvml))
    except TimedOut as exc:
        return SystemFacts(None, None, nvml_error=f"NVML {exc}", nvidia_devices=True)


def _library(facts: SystemFacts, torch: TorchFacts | None) -> list[Check]:
    from gpubox.doctor.library_checks import library_checks

    return library_checks(facts, torch)


def _host(view: Any, facts: SystemFacts, t: Thresholds, copying: bool) -> list[Check]:
    from gpubox.doctor.host_checks import host_checks
    from gpubox.doctor.transfer_run import COPY_BYTES

    # The transfer benchmark holds two host buffers of COPY_BYTES (one pinned): they must fit in available memory.
    return host_checks(view, facts, t, pinned_bytes=2 * COPY_BYTES if copying else 0)


def _gpu(facts: SystemFacts, samples: list[LinkSample], t: Thresholds) -> list[Check]:
    from gpubox.doctor.gpu_checks import gpu_checks
    from gpubox.doctor.nvml_facts import read_slot_limits

    return gpu_checks(facts, samples, t, slots=read_slot_limits(facts))


def _data(path: Path, t: Thresholds, view: Any) -> list[Check]:
    from gpubox.doctor.data_checks import data_checks

    return data_checks(path, t, view)


def _chosen_gpus(options: DoctorOptions, facts: SystemFacts) -> list[int]:
    known = [g.index for g in facts.gpus]
    if options.gpus is not None:
        missing = [g for g in options.gpus if g not in known]
        if missing:
            have = ", ".join(map(str, known)) or "none"
            raise GpuboxError(f"--gpu: no GPU {missing[0]} on this box (GPUs: {have})", ExitCode.USAGE)
        return list(options.gpus)
    return known if options.mode == "full" else known[:1]
