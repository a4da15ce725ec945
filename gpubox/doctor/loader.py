"""`gpubox doctor loader MODULE:FACTORY`: run loader_bench.py under the training environment's
interpreter, read its measurements into records, and decide whether the job is input-bound, which
DataLoader setting is best, and how much fixing the input can speed the job up at most.

The job is input-bound when the loader (with the copy to the GPU) gives fewer than
`loader_rate_ratio` times the batches per second the step can take, or when the step waits for
data more than `loader_wait_fraction` of the time. A step that waits a fraction f of the time can
get at most 1/(1-f) times faster from a faster input pipeline.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpubox.doctor.findings import DoctorReport, exit_code, make_report
from gpubox.doctor.model import Check, Status, skipped
from gpubox.doctor.thresholds import Thresholds
from gpubox.exit_codes import ExitCode, GpuboxError

BUDGET_S = {"quick": 20.0, "full": 90.0}
MARGIN_S = 30.0  # past the budget: the interpreter's start, worker shutdown, a stuck step
SAME_RATE = 0.03  # rates this close are the same within the noise of a short measurement
MAX_SPEEDUP_WAIT = 0.99  # a wait fraction above this would promise more than can be measured
USAGE_KINDS = frozenset({"spec", "not_found", "not_callable", "device"})
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_NAME}(\.{_NAME})*")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


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
        if budget_s is not None and budget_s <= 0:
            raise LoaderUsageError(f"budget: expected seconds above 0, got {budget_s:g}")
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
    usable_cpus: int
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
            usable_cpus=int(doc["cpus"]["usable"]),
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
    if options.max_workers is not None:
        args += ["--max-workers", str(options.max_workers)]
    run = run_script("loader_bench.py", args, python=options.python, timeout_s=options.budget + MARGIN_S)
    data = run.data
    error = data.get("error") if data is not None else None
    if data is not None and not data.get("torch_missing") and isinstance(error, Mapping):
        sentence = str(error.get("message"))
        if error.get("exception"):
            sentence += f": {error['exception']}"
        raise (LoaderUsageError if error.get("kind") in USAGE_KINDS else LoaderRunError)(sentence)
    if data is None or run.failure is not None:
        raise LoaderRunError(run.failure or "the loader benchmark gave no answer")
    return data


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class LoaderVerdict:
    own: SettingRun | None  # the factory's own loader; None when it could not be measured
    best: SettingRun | None  # the highest pipeline rate of the settings measured
    feed_rate: float | None  # the own loader's batches/s (with the copy to the GPU)
    step_rate: float | None
    rate_ratio: float | None  # feed_rate / step_rate
    wait_fraction: float | None  # of the own pipeline; None without a step
    input_bound: bool | None  # None: nothing to compare (no step, or nothing measured)
    speedup: float | None  # best pipeline rate / own pipeline rate
    max_speedup: float | None  # 1 / (1 - wait_fraction): the most a faster input can give


def best_run(runs: tuple[SettingRun, ...]) -> SettingRun | None:
    """The highest pipeline rate; of the runs within noise of it, the one with the fewest workers
    and the smallest prefetch, which cost the least memory (and the factory's own first)."""
    measured = [r for r in runs if r.pipeline_rate]
    if not measured:
        return None
    top = max(r.pipeline_rate or 0.0 for r in measured)
    close = [r for r in measured if (r.pipeline_rate or 0.0) >= top * (1 - SAME_RATE)]
    return min(close, key=lambda r: (not r.own, r.setting.num_workers, r.setting.prefetch_factor or 0))


def decide(bench: LoaderBench, t: Thresholds) -> LoaderVerdict:
    own = next((r for r in bench.runs if r.own and r.pipeline_rate), None)
    best = best_run(bench.runs)
    feed = own.feed_rate if own else None
    step = bench.step.rate if bench.step else None
    ratio = feed / step if feed is not None and step else None
    wait = own.pipeline.wait_fraction if own and own.pipeline and bench.step else None
    if bench.step is None or (ratio is None and wait is None):
        bound = None
    else:
        bound = (ratio is not None and ratio < t.loader_rate_ratio) or (
            wait is not None and wait > t.loader_wait_fraction
        )
    speedup = None
    if own and best and own.pipeline_rate and best.pipeline_rate:
        speedup = best.pipeline_rate / own.pipeline_rate
    most = 1.0 / (1.0 - min(wait, MAX_SPEEDUP_WAIT)) if wait is not None else None
    return LoaderVerdict(own, best, feed, step, ratio, wait, bound, speedup, most)


def _r(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def input_bound_check(bench: LoaderBench, v: LoaderVerdict, t: Thresholds) -> Check:
    title, where = "Input-bound", "the GPU" if bench.device_kind == "cuda" else "the CPU"
    evidence = {
        "feed_rate": v.feed_rate,
        "step_rate": v.step_rate,
        "rate_ratio": v.rate_ratio,
        "wait_fraction": v.wait_fraction,
        "max_speedup": v.max_speedup,
        "loader_rate_ratio": t.loader_rate_ratio,
        "loader_wait_fraction": t.loader_wait_fraction,
    }
    if v.own is None:
        own = next((r for r in bench.runs if r.own), None)
        why = f"the factory's loader gave no rate within the {bench.budget_s:g} s budget"
        said = [own.error] if own and own.error else []
        if own and own.startup_s is not None:
            said.append(f"its first batch took {own.startup_s:.1f} s")
        why += f" ({'; '.join(said)})" if said else ""
        return skipped("loader.input_bound", title, "loader", why + "; try --full")
    if bench.step is None:
        why = (
            f"no step to compare against: the loader alone gives {_r(v.feed_rate)} batches/s; "
            "return (loader, step) from the factory to know whether the step waits for it"
        )
        return skipped("loader.input_bound", title, "loader", why)
    feed_words = "with the copy to the GPU" if bench.device_kind == "cuda" else "alone"
    detail = f"the loader gives {_r(v.feed_rate)} batches/s {feed_words}, the step alone takes {_r(v.step_rate)}"
    if v.rate_ratio is not None:
        detail += f" ({v.rate_ratio:.2f}x)" if v.rate_ratio >= 0.01 else " (under 0.01x)"
    if v.wait_fraction is not None:
        detail = f"the step waits for data {v.wait_fraction:.0%} of the time; {detail}"
    if not v.input_bound:
        meaning = f"the input pipeline keeps {where} fed"
        return Check(**_input_bound_fields(title, "ok", detail, v), meaning=meaning, evidence=evidence)
    lost = max(v.wait_fraction or 0.0, 1.0 - min(v.rate_ratio or 1.0, 1.0))  # the share of time at stake
    severe = (v.wait_fraction or 0.0) > 2 * t.loader_wait_fraction or (v.rate_ratio or 1.0) < 1.0
    meaning = f"{where} waits for its next batch: a faster input pipeline can make the job"
    meaning += f" up to {v.max_speedup:.3g}x faster" if v.max_speedup else " faster"
    if v.speedup and v.best and not v.best.own:
        meaning += f"; the best setting found gave {v.speedup:.2f}x"
    return Check(
        **_input_bound_fields(title, "fail" if severe else "warn", detail, v),
        meaning=meaning,
        fix=_fix(bench, v),
        impact=min(max(lost, 0.0), 1.0),
        evidence=evidence,
    )


def _input_bound_fields(title: str, status: Status, detail: str, v: LoaderVerdict) -> dict[str, Any]:
    return {
        "id": "loader.input_bound",
        "title": title,
        "category": "loader",
        "status": status,
        "detail": detail,
        "value": _pct(v.wait_fraction),
        "unit": "%",
    }


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(100 * fraction, 1)


def _fix(bench: LoaderBench, v: LoaderVerdict) -> str:
    best = v.best
    if best is not None and not best.own and (v.speedup or 0.0) > 1.0:
        fix = best.setting.call()
        if best.setting.num_workers >= bench.max_workers > 0:
            fix += f"; it was the most workers tried: try more with --max-workers {2 * bench.max_workers}"
        return fix
    return (
        "no setting tried loads faster: make each batch cheaper to produce (decode less, cache decoded "
        "items, move augmentation to the GPU) or give the job more CPUs"
    )


def best_setting_check(bench: LoaderBench, v: LoaderVerdict) -> Check:
    title = "Best DataLoader setting"
    tried = len([r for r in bench.runs if r.pipeline_rate])
    if v.best is None or v.best.pipeline_rate is None:
        why = f"no setting gave a rate within the {bench.budget_s:g} s budget; try --full"
        return skipped("loader.best_setting", title, "loader", why)
    best = v.best
    evidence = {
        "best": best.setting,
        "own": bench.own,
        "speedup": v.speedup,
        "tried": tried,
        "not_tried": len(bench.not_tried),
        "truncated": bench.truncated,
    }
    rate = f"{best.pipeline_rate:.3g} batches/s"
    common: dict[str, Any] = {
        "id": "loader.best_setting",
        "title": title,
        "category": "loader",
        "value": best.pipeline_rate,
        "unit": "batches/s",
        "evidence": evidence,
    }
    if v.own is None or v.speedup is None:
        detail = f"{best.setting.arguments()}: {rate}, the fastest of {tried} tried"
        return Check(**common, status="ok", detail=detail)
    if best.own:
        detail = f"the factory's own setting ({best.setting.arguments()}) was the fastest of {tried} tried: {rate}"
        return Check(**common, status="ok", detail=detail)
    detail = (
        f"{best.setting.arguments()}: {rate}, {v.speedup:.2f}x the factory's own "
        f"({bench.own.arguments()}: {_r(v.own.pipeline_rate)}); {tried} settings tried"
    )
    if v.input_bound is not None or v.speedup < 1.1:
        return Check(**common, status="ok", detail=detail)
    # without a step nobody knows whether loading limits the job, so a faster loader is worth a look
    return Check(
        **common,
        status="warn",
        detail=detail,
        meaning="the loader alone can be this much faster; return (loader, step) to know whether it matters",
        fix=best.setting.call(),
        impact=1 - 1 / v.speedup,
    )


def device_check(bench: LoaderBench) -> Check:
    title = "Device"
    if bench.device_kind == "cuda":
        detail = f"ran on {bench.device} ({bench.gpu_name or 'GPU'}), copies from pinned memory with non_blocking=True"
        return Check("loader.device", title, "loader", "ok", detail, value=bench.device, unit="text")
    if bench.device_asked == "cpu":
        return Check("loader.device", title, "loader", "ok", "ran on the CPU, as asked", value="cpu", unit="text")
    why = f"no GPU found ({bench.device_reason}): measured on the CPU, without the copy to a GPU"
    return skipped("loader.device", title, "loader", why)


def loader_checks(bench: LoaderBench, t: Thresholds) -> list[Check]:
    v = decide(bench, t)
    return [input_bound_check(bench, v, t), best_setting_check(bench, v), device_check(bench)]


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
        "cpus": {"usable": bench.usable_cpus, "max_workers": bench.max_workers},
        "factory": bench.factory,
        "step": bench.step,
        "verdict": decide(bench, t),
    }
    report = make_report("doctor loader", bench.mode, checks, {"loader": table(bench)}, facts, bench.elapsed_s, notes)
    return report, exit_code(checks, no_gpu_but_asked=False)
