"""The doctor's report for people: the summary line, the findings ranked with their fixes, then
what was measured (benchmark tables and every check)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpubox.doctor.findings import DoctorReport
from gpubox.doctor.model import CATEGORIES, Check
from gpubox.envelope import to_jsonable
from gpubox.format import size

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def _where(check: Check) -> str:
    return "" if check.gpu is None else f"GPU {check.gpu}"


def _value(check: Check) -> str:
    value = check.value
    if value is None:
        return "–"
    if check.unit == "bytes" and isinstance(value, (int, float)):
        return size(value)
    if isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    elif isinstance(value, (list, tuple, dict)):
        return "…"  # structured: its detail line says it in words
    else:
        text = str(value)
    return f"{text} {check.unit}" if check.unit and check.unit not in {"count", "text"} else text


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _rows_of(value: Any) -> list[Mapping[str, Any]] | None:
    """A benchmark as rows: a list of records, or a record holding one list of records."""
    if isinstance(value, list) and value and all(isinstance(r, Mapping) for r in value):
        return value
    if isinstance(value, Mapping):
        lists = [v for v in value.values() if isinstance(v, list) and v and all(isinstance(r, Mapping) for r in v)]
        if len(lists) == 1:
            return list(lists[0])
    return None


LONG_RUN = 40  # checks; more than this, the passed ones are listed only with -v


def render(report: DoctorReport, console: Any, verbose: bool = False) -> None:
    from rich.table import Table
    from rich.text import Text

    worst = "fail" if report.counts.get("fail") else "warn" if report.counts.get("warn") else "ok"
    console.print(Text(f"gpubox {report.command} ({report.mode}): {report.summary}", style=STYLE[worst]))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="dim"))

    if report.findings:
        console.print()
        table = Table(title="Findings, most urgent first", title_justify="left", show_lines=True, expand=False)
        for name in ("#", "", "where", "finding", "fix"):
            table.add_column(name, overflow="fold")
        for i, check in enumerate(report.findings, 1):
            finding = Text(f"{check.title}: ", style="bold")
            finding.append(check.detail)
            if check.meaning:
                finding.append(f"\n{check.meaning}", style="dim")
            table.add_row(
                str(i), Text(MARK[check.status], style=STYLE[check.status]), _where(check), finding, check.fix or ""
            )
        console.print(table)

    for name, value in report.benchmarks.items():
        rows = transfer_rows(value) if name == "transfer" else _rows_of(to_jsonable(value))
        if not rows:
            continue
        console.print()
        keys = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
        table = Table(title=f"Measured: {name}", title_justify="left")
        for key in keys:
            table.add_column(key.replace("_", " "), justify="right" if _numeric(rows, key) else "left")
        for row in rows:
            table.add_row(*(_cell(row.get(k)) for k in keys))
        console.print(table)

    checks = _in_category_order(report.checks)
    if checks:  # none ran (GPU groups on a box without GPUs): the summary says so; no empty table
        console.print()
        _print_checks(console, checks, verbose)
    console.print(Text(f"took {report.took_s:.1f} s; --json gives every figure", style="dim"))


def _print_checks(console: Any, checks: Sequence[Check], verbose: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    # A long run (8 GPUs, --full) lists what did not pass, unless -v: the passes would bury it.
    brief = not verbose and len(checks) > LONG_RUN
    title = "Every check that did not pass (-v lists them all)" if brief else "Every check"
    table = Table(title=title, title_justify="left")
    for name in ("", "check", "where", "value", "detail"):
        table.add_column(name, overflow="fold")
    for check in checks:
        if check.status == "ok" and brief:
            continue
        table.add_row(
            Text(MARK[check.status], style=STYLE[check.status]), check.title, _where(check), _value(check), check.detail
        )
    console.print(table)


def _numeric(rows: Sequence[Mapping[str, Any]], key: str) -> bool:
    return all(isinstance(r.get(key), (int, float)) or r.get(key) is None for r in rows)


def _in_category_order(checks: Sequence[Check]) -> list[Check]:
    order = {name: i for i, name in enumerate(CATEGORIES)}
    return sorted(checks, key=lambda c: (order.get(c.category, len(order)), c.gpu or 0))


def transfer_rows(results: Any) -> list[dict[str, Any]]:
    """The copy benchmarks as one row per GPU and kind of copy."""
    rows = []
    for result in results or []:
        for copy in (result.h2d_pinned, result.d2h_pinned, result.h2d_pageable, result.d2h_pageable):
            if copy.gb_per_s is None:
                continue
            rows.append(
                {
                    "gpu": result.gpu,
                    "copy": copy.name,
                    "GB/s": copy.gb_per_s,
                    "link": result.link_now.label if result.link_now else None,
                    "link GB/s": copy.link_gb_per_s,
                    "of link %": None if copy.link_fraction is None else 100 * copy.link_fraction,
                    "reps": copy.reps,
                    "timer": copy.timer,
                }
            )
    return rows
