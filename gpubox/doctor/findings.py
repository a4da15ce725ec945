"""The doctor's verdict: findings ranked by impact, one summary line, and the exit code."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpubox.doctor.model import CATEGORIES, STATUSES, Check
from gpubox.exit_codes import ExitCode

_SEVERITY = {"fail": 0, "warn": 1}


def rank(checks: Iterable[Check]) -> tuple[Check, ...]:
    """The checks that need attention, most urgent first: failures before warnings, then what is
    at stake (impact), then the order of categories (the driver before the pipeline), then GPU."""
    found = [c for c in checks if c.status in _SEVERITY]
    order = {name: i for i, name in enumerate(CATEGORIES)}
    return tuple(
        sorted(
            found,
            key=lambda c: (_SEVERITY[c.status], -c.impact, order.get(c.category, len(order)), c.gpu or 0, c.id),
        )
    )


def counts(checks: Iterable[Check]) -> dict[str, int]:
    out: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for check in checks:
        out[check.status] += 1
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary_line(checks: Sequence[Check], findings: Sequence[Check]) -> str:
    """One line: the tally, then the most urgent finding in its own words."""
    n = counts(checks)
    parts = [f"{n['fail']} failed", _plural(n["warn"], "warning"), f"{n['ok']} ok", f"{n['skip']} skipped"]
    tally = ", ".join(parts)
    if not findings:
        return f"{tally}: nothing to fix" if n["ok"] else f"{tally}: nothing could be checked"
    top = findings[0]
    where = f"GPU {top.gpu}: " if top.gpu is not None else ""
    return f"{tally}. First: {where}{top.title}: {top.detail}"


NO_GPU_NOTE = "GPU checks were asked for, but no GPU was found"  # the note of a run that exits 3


def exit_code(checks: Sequence[Check], no_gpu_but_asked: bool) -> ExitCode:
    """3 when GPU checks were asked for by name on a box without GPUs, 5 when a check failed."""
    if no_gpu_but_asked:
        return ExitCode.NO_GPU
    if any(c.status == "fail" for c in checks):
        return ExitCode.CHECK_FAILED
    return ExitCode.OK


@dataclass(frozen=True)
class DoctorReport:
    """Everything one run found: for `--json` (stable keys, explicit nulls) and for the renderer."""

    command: str  # "doctor" or "doctor loader"
    mode: str  # "quick" or "full"
    summary: str
    counts: Mapping[str, int]
    findings: tuple[Check, ...]  # the warnings and failures, most urgent first
    checks: tuple[Check, ...]  # every check, in the order they ran
    benchmarks: Mapping[str, Any] = field(default_factory=dict)  # name -> measured tables, or None
    facts: Mapping[str, Any] = field(default_factory=dict)  # what the checks were made from
    took_s: float = 0.0
    notes: tuple[str, ...] = ()  # what the run could not do, in a sentence each


def make_report(
    command: str,
    mode: str,
    checks: Sequence[Check],
    benchmarks: Mapping[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    took_s: float = 0.0,
    notes: Sequence[str] = (),
) -> DoctorReport:
    ranked = rank(checks)
    return DoctorReport(
        command=command,
        mode=mode,
        summary=summary_line(checks, ranked),
        counts=counts(checks),
        findings=ranked,
        checks=tuple(checks),
        benchmarks=dict(benchmarks or {}),
        facts=dict(facts or {}),
        took_s=took_s,
        notes=tuple(notes),
    )
