"""`gpubox doctor loader MODULE:FACTORY`: run loader_bench.py under the training environment's
interpreter, read its measurements into records, and decide whether the job is input-bound, which
DataLoader setting is best, and how much fixing the input can speed the job up at most.

The job is input-bound when the loader (with the copy to the GPU) gives fewer than
`loader_rate_ratio` times the batches per second the step can take, or when the step waits for
data more than `loader_wait_fraction` of the time. A step that waits a fraction f of the time can
get at most 1/(1-f) times faster from a faster input pipeline.
The verdict and the checks are in loader_checks.py.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpubox.doctor.findings import DoctorReport, exit_code, make_report
from gpubox.doctor.host_view import HostView, usable_cpus
from gpubox.doctor.loader_checks import WORKERS_PER_CPU, _pct, decide, loader_checks, worker_limit
from gpubox.doctor.thresholds import Thresholds
from gpubox.exit_codes import ExitCode, GpuboxError

BUDGET_S = {"quick": 20.0, "full": 90.0}
MAX_BUDGET_S = 86400.0  # a day: past it a typo, and far past it the timers overflow
MARGIN_S = 30.0  # past the budget: the interpreter's start, worker shutdown, a stuck step
USAGE_KINDS = frozenset({"spec", "not_found", "not_callable", "device"})
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_NAME}(\.{_NAME})*")
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")  # [0-9]: \d takes other scripts' digits too


class LoaderUsageError(GpuboxError):
    """A MODULE:FACTORY, --python or --device that cannot be used: one line, exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


class LoaderRunError(GpuboxError):
    """The factory, its loader or its step failed, or the benchmark could not finish: exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.FAILED)


@dataclass(frozen=True)
class LoaderOptions:
    target: str  # MODULE:FACTORY
    mode: str = "quick"
    python: str = sys.executable
    device: str = "auto"
    max_workers: int | None = None  # None: the usable CPUs
    path: str = "."  # put first on sys.path, so that a module of the current directory imports
    budget_s: float | None = None  # None: the mode's

    @classmethod
    def parse(
        cls,
        target: str,
        mode: str = "quick",
        python: str | None = None,
        device: str = "auto",
        max_workers: int | None = None,
        path: str | None = None,
        budget_s: float | None = None,
    ) -> LoaderOptions:
        """Options from the command line; a bad one is a LoaderUsageError that names it."""
        check_target(target)
        if mode not in BUDGET_S:
            raise LoaderUsageError(f"mode: expected quick or full, got {mode!r}")
        if not _DEVICE.fullmatch(device):
            raise LoaderUsageError(f"--device: expected auto, cpu or cuda:N, got {device!r}")
        if max_workers is not None and max_workers < 0:
            raise LoaderUsageError(f"--max-workers: expected 0 or more, got {max_workers}")
        if budget_s is not None and not (math.isfinite(budget_s) and 0 < budget_s <= MAX_BUDGET_S):
            raise LoaderUsageError(f"--budget: expected seconds above 0 and at most {MAX_BUDGET_S:g}, got {budget_s:g}")
        interpreter = sys.executable
        if python is not None:
            from gpubox.doctor.interpreter import check_interpreter

            interpreter = check_interpreter(python)
        where = os.path.abspath(path or os.getcwd())
        return cls(target, mode, interpreter, device, max_workers, where, budget_s)

    @property
    def budget(self) -> float:
        return self.budget_s if self.budget_s is not None else BUDGET_S[self.mode]


def check_target(target: str) -> None:
    """MODULE:FACTORY is a dotted module or a .py file that exists, then a dotted name."""
    module, sep, factory = target.rpartition(":")
    if not sep or not module or not factory:
        raise LoaderUsageError(f"expected MODULE:FACTORY such as train.py:make or my.module:make, got {target!r}")
    if not _DOTTED.fullmatch(factory):
        raise LoaderUsageError(f"{target}: {factory!r} is not a Python name")
    if module.endswith(".py") or os.sep in module:
        if not os.path.isfile(module):
            raise LoaderUsageError(f"{target}: there is no file {module}")
    elif not _DOTTED.fullmatch(module):
        raise LoaderUsageError(f"{target}: {module!r} is neither a module name nor a .py file")


# ---------------------------------------------------------------- the measurements, as records


@dataclass(frozen=True)
class LoaderSetting:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool

    def arguments(self) -> str:
        """As keyword arguments: "num_workers=8, pin_memory=True, prefetch_factor=4, persistent_workers=True"."""
        parts = [f"num_workers={self.num_workers}", f"pin_memory={self.pin_memory}"]
        if self.num_workers:
            parts += [f"prefetch_factor={self.prefetch_factor}", f"persistent_workers={self.persistent_workers}"]
        return ", ".join(parts)

    def call(self) -> str:
        return f"DataLoader(..., {self.arguments()})"


@dataclass(frozen=True)
class Rate:
    """One phase of one setting: batches in seconds, and the share of it blocked in next()."""

    batches: int
    seconds: float
    rate: float | None  # batches/s
    wait_fraction: float | None


@dataclass(frozen=True)
class SettingRun:
    setting: LoaderSetting
    own: bool  # the factory's own loader, as it came
    startup_s: float | None  # to the first batch (worker start-up): not in the rates
    loader: Rate | None  # the loader alone
    copy: Rate | None  # with the copy to the GPU; None on the CPU
    pipeline: Rate | None  # with the step (or a trivial consumer), and the wait
    complete: bool
    error: str | None

    @property
    def feed_rate(self) -> float | None:
        """What the step can get: with the copy to the GPU when there is one."""
        phase = self.copy or self.loader
        return phase.rate if phase else None

    @property
    def pipeline_rate(self) -> float | None:
        return self.pipeline.rate if self.pipeline else None


@dataclass(frozen=True)
class StepRate:
    rate: float | None  # calls/s on a batch already on the device
    calls: int
    first_call_s: float | None  # compilation, autotuning: not in the rate


@dataclass(frozen=True)
class LoaderBench:
    target: str
    mode: str
    budget_s: float
    elapsed_s: float
    device: str  # "cpu", "cuda:0"
    device_kind: str  # "cpu" or "cuda"
    device_asked: str
    device_reason: str
    gpu_name: str | None
    python: str
    torch: str | None
    usable_cpus: float  # fractional under a CPU quota
    cpus_limited_by: str | None  # "affinity", "cpuset", "cgroup v2 cpu.max", ...
    max_workers: int
    factory: Mapping[str, Any]
    own: LoaderSetting
    step: StepRate | None  # None: the factory gave no step
    runs: tuple[SettingRun, ...]
    not_tried: tuple[LoaderSetting, ...]
    truncated: bool
    notes: tuple[str, ...]


def _setting(d: Mapping[str, Any]) -> LoaderSetting:
    prefetch = d.get("prefetch_factor")
    return LoaderSetting(
        int(d["num_workers"]),
        bool(d["pin_memory"]),
        None if prefetch is None else int(prefetch),
        bool(d["persistent_workers"]),
    )


def _rate(d: Mapping[str, Any] | None) -> Rate | None:
    if not d:
        return None
    rate, wait = d.get("rate"), d.get("wait_fraction")
    return Rate(
        int(d["batches"]),
        float(d["seconds"]),
        None if rate is None else float(rate),
        None if wait is None else float(wait),
    )


def _run(r: Mapping[str, Any]) -> SettingRun:
    return SettingRun(
        setting=_setting(r),
        own=bool(r.get("own")),
        startup_s=r.get("startup_s"),
        loader=_rate(r.get("loader")),
        copy=_rate(r.get("copy")),
        pipeline=_rate(r.get("pipeline")),
        complete=bool(r.get("complete")),
        error=r.get("error"),
    )


def parse_bench(doc: Mapping[str, Any]) -> LoaderBench:
    """The records of a successful run of loader_bench.py; LoaderRunError when it is malformed."""
    try:
        device, factory, step = doc["device"], doc["factory"], doc["step"]
        runs = tuple(_run(r) for r in doc["settings"])
        return LoaderBench(
            target=str(factory["spec"]),
            mode=str(doc["mode"]),
            budget_s=float(doc["budget_s"]),
            elapsed_s=float(doc.get("elapsed_s") or 0.0),
            device=str(device["name"]),
            device_kind=str(device["kind"]),
            device_asked=str(device.get("asked") or "auto"),
            device_reason=str(device.get("reason") or ""),
            gpu_name=device.get("gpu_name"),
            python=str(doc.get("executable") or doc.get("python") or ""),
            torch=doc.get("torch"),
            usable_cpus=float(doc["cpus"]["usable"]),
            cpus_limited_by=doc["cpus"].get("limited_by"),
            max_workers=int(doc["cpus"]["max_workers"]),
            factory=dict(factory),
            own=_setting(factory["own"]),
            step=StepRate(step.get("rate"), int(step.get("calls") or 0), step.get("first_call_s"))
            if step.get("given")
            else None,
            runs=runs,
            not_tried=tuple(_setting(s) for s in doc.get("not_tried", ())),
            truncated=bool(doc.get("truncated")),
            notes=tuple(str(n) for n in doc.get("notes", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LoaderRunError(f"the loader benchmark printed results that cannot be read ({exc!r})") from None


def run_bench(options: LoaderOptions) -> Mapping[str, Any]:
    """Run loader_bench.py and return its JSON answer; the error it reports, as an exception."""
    from gpubox.doctor.interpreter import run_script

    args = [options.target, "--budget", f"{options.budget:g}", "--device", options.device, "--path", options.path]
    if options.mode == "full":
        args.append("--full")
    # the script sees only its affinity: a container's cpuset and CPU quota are read here
    cpus = usable_cpus(HostView.live())
    max_workers = options.max_workers
    known = cpus.count if cpus.count is not None else os.cpu_count()
    if max_workers is not None and known is not None and max_workers > worker_limit(known):
        # a typo (100000 for 10) would start that many processes on a shared box
        raise LoaderUsageError(
            f"--max-workers: at most {worker_limit(known)} ({WORKERS_PER_CPU} a usable CPU, {known:g} here),"
            f" got {max_workers}"
        )
    if max_workers is None and cpus.count is not None:
        max_workers = max(1, math.floor(cpus.count))
    if max_workers is not None:
        args += ["--max-workers", str(max_workers)]
    run = run_script("loader_bench.py", args, python=options.python, timeout_s=options.budget + MARGIN_S)
    data = run.data
    if data is not None and cpus.count is not None and isinstance(data.get("cpus"), Mapping):
        data = {**data, "cpus": {**data["cpus"], "usable": cpus.count, "limited_by": cpus.how}}
    error = data.get("error") if data is not None else None
    torch_failed = data is not None and (data.get("torch_missing") or data.get("torch_error"))
    if data is not None and not torch_failed and isinstance(error, Mapping):
        sentence = str(error.get("message"))
        if error.get("exception"):
            sentence += f": {error['exception']}"
        raise (LoaderUsageError if error.get("kind") in USAGE_KINDS else LoaderRunError)(sentence)
    if data is None or run.failure is not None:
        raise LoaderRunError(run.failure or "the loader benchmark gave no answer")
    return data


def table(bench: LoaderBench) -> list[dict[str, Any]]:
    """One row per setting measured, for the report's "Measured: loader" table."""
    return [
        {
            "setting": "own" if r.own else "",
            "num_workers": r.setting.num_workers,
            "pin_memory": r.setting.pin_memory,
            "prefetch_factor": r.setting.prefetch_factor,
            "persistent_workers": r.setting.persistent_workers,
            "startup_s": r.startup_s,
            "loader_per_s": r.loader.rate if r.loader else None,
            "copy_per_s": r.copy.rate if r.copy else None,
            "pipeline_per_s": r.pipeline_rate,
            "wait_pct": _pct(r.pipeline.wait_fraction) if r.pipeline and bench.step else None,
            "error": r.error,
        }
        for r in bench.runs
    ]


def examine_loader(options: LoaderOptions, t: Thresholds) -> tuple[DoctorReport, ExitCode]:
    """Measure the factory's loader and turn the figures into the report of `doctor loader`."""
    bench = parse_bench(run_bench(options))
    checks = loader_checks(bench, t)
    notes = list(bench.notes)
    if bench.not_tried:
        notes.append(
            f"{len(bench.not_tried)} setting(s) not tried within the {bench.budget_s:g} s budget (--full tries more)"
        )
    notes += [f"{r.setting.arguments()}: {r.error}" for r in bench.runs if r.error]
    facts = {
        "target": bench.target,
        "python": bench.python,
        "torch": bench.torch,
        "device": {"name": bench.device, "gpu_name": bench.gpu_name, "reason": bench.device_reason},
        "cpus": {"usable": bench.usable_cpus, "limited_by": bench.cpus_limited_by, "max_workers": bench.max_workers},
        "factory": bench.factory,
        "step": bench.step,
        "verdict": decide(bench, t),
    }
    report = make_report("doctor loader", bench.mode, checks, {"loader": table(bench)}, facts, bench.elapsed_s, notes)
    return report, exit_code(checks, no_gpu_but_asked=False)
