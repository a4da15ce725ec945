"""The verdict on a DataLoader benchmark and its checks: decide() turns a LoaderBench into a
LoaderVerdict (the own and best settings, feed and step rates, the wait, whether the job is
input-bound and how much faster it can get), and loader_checks() into loader.input_bound,
loader.best_setting and loader.device. Pure functions of the records loader.py reads and the
thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpubox.doctor.model import Check, Status, skipped
from gpubox.doctor.thresholds import Thresholds

if TYPE_CHECKING:
    from gpubox.doctor.loader import LoaderBench, SettingRun

SAME_RATE = 0.03  # rates this close are the same within the noise of a short measurement
WORKERS_PER_CPU = 4  # more DataLoader workers than this per CPU only take turns on it
MAX_SPEEDUP_WAIT = 0.99  # a wait fraction above this would promise more than can be measured


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
    detail = (
        f"the loader gives {_r(v.feed_rate)} batches/s {feed_words}, the step alone runs {_r(v.step_rate)} batches/s"
    )
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


def worker_limit(cpus: float) -> int:
    """The most workers `--max-workers` may ask for with this many usable CPUs."""
    return max(16, WORKERS_PER_CPU * math.ceil(cpus))


def _fix(bench: LoaderBench, v: LoaderVerdict) -> str:
    best = v.best
    if best is not None and not best.own and (v.speedup or 0.0) > 1.0:
        fix = best.setting.call()
        if best.setting.num_workers >= bench.max_workers > 0:
            # never past what --max-workers takes: the advice would be refused
            limit = worker_limit(bench.usable_cpus)
            more = min(2 * bench.max_workers, limit)
            if more > bench.max_workers:
                fix += f"; it was the most workers tried: try more with --max-workers {more}"
            else:
                fix += (
                    f"; it was the most workers tried, and the most --max-workers takes here ({limit}): more "
                    f"would only take turns on the {bench.usable_cpus:g} usable CPUs, so give the job more CPUs"
                )
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
        detail = f"ran on {bench.device} ({bench.gpu_name or 'GPU'}); {_copies(bench.runs)}"
        return Check("loader.device", title, "loader", "ok", detail, value=bench.device, unit="text")
    if bench.device_asked == "cpu":
        return Check("loader.device", title, "loader", "ok", "ran on the CPU, as asked", value="cpu", unit="text")
    why = f"no GPU found ({bench.device_reason}): measured on the CPU, without the copy to a GPU"
    return skipped("loader.device", title, "loader", why)


def _copies(runs: tuple[SettingRun, ...]) -> str:
    """How the copies to the GPU were made: the benchmark copies with non_blocking=True only from pinned memory."""
    copied = [r for r in runs if r.copy is not None] or list(runs)
    pinned = {r.setting.pin_memory for r in copied}
    if not pinned:
        return "no copy to it was measured"
    if pinned == {True}:
        return "copies from pinned memory with non_blocking=True (every setting measured had pin_memory=True)"
    if pinned == {False}:
        return "blocking copies from pageable memory (every setting measured had pin_memory=False)"
    return (
        "copies from pinned memory with non_blocking=True for the settings with pin_memory=True, "
        "blocking copies from pageable memory for those with pin_memory=False"
    )


def loader_checks(bench: LoaderBench, t: Thresholds) -> list[Check]:
    v = decide(bench, t)
    return [input_bound_check(bench, v, t), best_setting_check(bench, v), device_check(bench)]
