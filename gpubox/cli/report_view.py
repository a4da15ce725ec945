"""`gpubox report` for people (a summary line, the table, a chart of utilisation per GPU, the
findings) and for spreadsheets (CSV of the rows)."""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import IO, Any

from gpubox.format import DASH, size
from gpubox.ledger.findings import AttemptFinding, UnallocatedHour
from gpubox.ledger.report import LedgerReport, UsageRow
from gpubox.ledger.series import GpuSeries

BLOCKS = "▁▂▃▄▅▆▇█"
CHART_MAX_COLUMNS = 120
MAX_TABLE_ROWS = 100  # a terminal table past this is scrolled past; the CSV and JSON have every row
# Chart steps people read easily; past the last, whole multiples of it.
_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)


@dataclass(frozen=True)
class ReportView:
    """What the human rendering shows: the report as grouped, the same window by GPU (the summary
    line and the calendar), and the utilisation series of each GPU for the chart."""

    report: LedgerReport
    by_gpu: LedgerReport
    series: tuple[GpuSeries, ...]
    step_s: int


def csv_header() -> list[str]:
    return [f.name for f in fields(UsageRow)]


def write_csv(rows: Sequence[UsageRow], out: IO[str]) -> None:
    """One line per row, the columns named as UsageRow's fields; an unknown figure is an empty cell.
    Figures stay numbers; text is written so that a spreadsheet keeps it as text (`csv_text`)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(csv_header())
    for row in rows:
        writer.writerow([_csv_cell(row, name) for name in csv_header()])


# Cells a spreadsheet would run as a formula (a job name or tag is anyone's text).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """Text a spreadsheet would run as a formula, with a leading quote, which spreadsheets take to
    mean "text". The quote stays in the data for every other reader, so it is added only where a
    formula would otherwise run; GPU labels get a word instead (`_csv_cell`)."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _csv_cell(row: UsageRow, name: str) -> object:
    value = getattr(row, name)
    if value is None:
        return ""
    if name == "group" and row.gpu_uuid is not None:
        # "gpu 0/3", not "0/3", which spreadsheets read as a date; whole GPUs alike, so the column sorts as one
        return f"gpu {value}"
    return csv_text(value) if isinstance(value, str) else value


def chart_step(since: float, until: float, columns: int, least: int = 60) -> int:
    """The shortest readable step (whole minutes, a multiple of `least`) that puts the window in
    `columns` cells."""
    span = until - since
    for step in _STEPS:
        if step % least == 0 and span / step <= columns:
            return step
    return _STEPS[-1] * math.ceil(span / (_STEPS[-1] * columns))


def chart_columns(console_width: int, label_width: int) -> int:
    return max(10, min(CHART_MAX_COLUMNS, console_width - label_width - 4))


# Figures


def hours(value: float | None) -> str:
    if value is None:
        return DASH
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def money(value: float | None) -> str:
    return DASH if value is None else f"{value:,.2f}"


def kwh(value: float | None) -> str:
    if value is None:
        return DASH
    if abs(value) < 10:
        return f"{value:.3f}"
    return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def share(part: float | None, whole: float | None) -> str:
    """A percentage of two figures the report gives, for reading: a dash when either is unknown."""
    if part is None or not whole:
        return DASH
    return f"{100 * part / whole:.0f}%"


def when(t: float | None) -> str:
    return DASH if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def span(seconds: float) -> str:
    """A window or a step: 90m, 2h, 1h30m, 7d, 1d12h (to the minute)."""
    minutes = round(seconds / 60)
    days, rest = divmod(minutes, 1440)
    hours_, mins = divmod(rest, 60)
    if days:
        return f"{days}d{hours_:02d}h" if hours_ else f"{days}d"
    if not hours_:
        return f"{mins}m"
    return f"{hours_}h{mins:02d}m" if mins else f"{hours_}h"


def cards(report: LedgerReport) -> int:
    """GPUs in the window: cards, not their MIG instances."""
    return sum(1 for r in report.rows if r.mig_instance is None)


# Rendering


def render(view: ReportView, console: Any) -> None:
    from rich.text import Text

    report = view.report
    console.print(Text(summary(view), style="bold"))
    for note in notes(report):
        console.print(Text(f"note: {note}", style="dim"))
    console.print()
    console.print(table(report, console.width))
    if view.series:
        console.print()
        for line in chart(view):
            console.print(line)
    console.print()
    for line in findings(report):
        console.print(line)


def summary(view: ReportView) -> str:
    r, t = view.report, view.by_gpu.total
    parts = [
        f"{when(r.since)} → {when(r.until)} ({span(r.until - r.since)})",
        f"{cards(view.by_gpu)} GPU{'' if cards(view.by_gpu) == 1 else 's'}",
        f"{hours(t.calendar_gpu_hours)} calendar GPU-h, {share(t.allocated_gpu_hours, t.calendar_gpu_hours)}"
        f" allocated, {share(t.busy_gpu_hours, t.calendar_gpu_hours)} busy",
        f"idle while allocated {hours(t.idle_allocated_gpu_hours)} GPU-h",
        f"starved {hours(t.starved_gpu_hours)} GPU-h",
        f"energy {kwh(t.energy_kwh)} kWh",
    ]
    if t.cost is not None or r.price_per_gpu_hour is not None or r.price_per_kwh is not None:
        parts.append(f"box cost {money(t.cost)}")  # the calendar's, whatever the grouping prices in its rows
    return "gpubox report: " + " · ".join(parts)


def notes(report: LedgerReport) -> list[str]:
    found = []
    if report.recorded_until is None:
        found.append("nothing has been recorded yet: the gpubox daemon records GPU use while it runs")
    elif report.recording_stale:
        found.append(
            f"nothing recorded since {when(report.recorded_until)}: is the daemon running? (gpubox daemon status)"
        )
    if report.recorded_from is not None and report.until <= report.recorded_from:
        found.append(f"the ledger begins at {when(report.recorded_from)}: nothing is recorded in this window")
    elif report.recorded_until is not None and not report.recording_stale and report.until - report.recorded_until > 1:
        stamp = time.strftime("%H:%M:%S", time.localtime(report.recorded_until))
        found.append(f"recorded up to {stamp}: the daemon writes what it sampled once a minute")
    if report.by != "gpu":
        found.append(f"by {report.by}, every hour that overlaps the window counts whole")
    if any(r.mig_instance is not None for r in report.rows):
        found.append(
            "a MIG instance counts as a GPU of its own: a card split in N instances can have up to N"
            " allocated or busy GPU-hours per calendar hour"
        )
    if report.by == "gpu" and report.price_per_gpu_hour is not None:
        found.append("by gpu, the GPU-hour price applies to calendar hours (MIG instances: their card pays)")
    elif report.price_per_gpu_hour is not None:
        found.append(f"by {report.by}, the GPU-hour price applies to allocated hours")
    return found


Column = tuple[str, Callable[[UsageRow], str]]
MIN_TEXT_WIDTH = 8  # "quantize", "total"; a longer name folds on a narrow terminal

_FIGURES: tuple[Column, ...] = (
    ("alloc", lambda r: hours(r.allocated_gpu_hours)),
    ("busy", lambda r: hours(r.busy_gpu_hours)),
    ("idle\nalloc", lambda r: hours(r.idle_allocated_gpu_hours)),
    ("starved", lambda r: hours(r.starved_gpu_hours)),
)
_MONEY: tuple[Column, ...] = (("kWh", lambda r: kwh(r.energy_kwh)), ("cost", lambda r: money(r.cost)))
_ATTEMPTS: Column = ("attempts", lambda r: DASH if r.attempts is None else str(r.attempts))
_UNQUEUED: Column = ("unqueued", lambda r: hours(r.unqueued_gpu_hours))
_TEXT = {"GPU", "name", "job", "kind", "user", "tag"}


def _text(value: object) -> str:
    return DASH if value is None else str(value)


def columns(by: str) -> tuple[Column, ...]:
    if by == "gpu":
        lead: tuple[Column, ...] = (
            ("GPU", lambda r: r.group),
            ("name", lambda r: _text(_short_gpu_name(r.gpu_name)) if r.group != "total" else ""),
            ("calendar", lambda r: hours(r.calendar_gpu_hours)),
        )
        occupancy: Column = (
            "SM\nocc",
            lambda r: DASH if r.mean_sm_occupancy is None else f"{r.mean_sm_occupancy:.0f}%",
        )
        return (*lead, *_FIGURES, _UNQUEUED, occupancy, *_MONEY)
    if by == "job":
        lead = (
            ("job", lambda r: r.group),
            ("name", lambda r: _text(r.job_name) if r.group != "total" else ""),
            ("kind", lambda r: _text(r.kind) if r.group != "total" else ""),
            ("user", lambda r: _text(r.user) if r.group != "total" else ""),
            _ATTEMPTS,
        )
        peak: Column = ("peak\nmem", lambda r: size(r.peak_gpu_mem_bytes))
        return (*lead, *_FIGURES, peak, *_MONEY)
    lead = ((by, lambda r: r.group), _ATTEMPTS)
    return (*lead, *_FIGURES, _UNQUEUED, *_MONEY) if by == "user" else (*lead, *_FIGURES, *_MONEY)


_BUSY_SOURCES = {"mixed": "sm_active where GPM gives it, else gpu_busy", "": "– (never known)"}


def shown_rows(rows: Sequence[UsageRow]) -> Sequence[UsageRow]:
    """Every row, or on a long report the MAX_TABLE_ROWS that held the most, in the report's order."""
    if len(rows) <= MAX_TABLE_ROWS:
        return rows
    most = sorted(range(len(rows)), key=lambda i: -rows[i].allocated_gpu_hours)[:MAX_TABLE_ROWS]
    return [rows[i] for i in sorted(most)]


# Where a terminal is too narrow for every column, these go first (in this order) rather than have
# rich squeeze figures into wrong ones; --csv and --json keep them all.
DROPPED_FIRST = ("attempts", "peak\nmem", "SM\nocc", "unqueued", "name", "user", "kWh", "kind", "calendar", "starved")
COLUMN_GAP, EDGES = 2, 2  # what rich puts between two columns here, and at the two edges


def table(report: LedgerReport, width: int | None = None) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    grouped = f"{report.by} ({report.tag_key})" if report.tag_key else report.by
    notes = [f"busy by {_BUSY_SOURCES.get(report.total.busy_source or '', report.total.busy_source)}"]
    if report.by == "job":
        notes.append("peak mem: the most the job held on one GPU")
    shown = shown_rows(report.rows)
    more = len(report.rows) - len(shown)
    if more:
        notes.append(f"{more:,} more rows with less allocated: --csv or --json has every one")
    cols = list(columns(report.by))
    cells = [[cell(row) for _, cell in cols] for row in (*shown, report.total)]
    widths = [
        min(widest, MIN_TEXT_WIDTH) if _is_text(name, report.by) else widest
        for name, widest in ((name, _widest(name, [r[i] for r in cells])) for i, (name, _) in enumerate(cols))
    ]
    left_out = []
    for name in DROPPED_FIRST:
        if width is None or sum(widths) + COLUMN_GAP * (len(widths) - 1) + EDGES <= width:
            break
        names = [c[0] for c in cols]
        if name in names[1:]:  # never the first: it says what each row is
            i = names.index(name)
            left_out.append(name.replace("\n", " "))
            del cols[i], widths[i]
            for r in cells:
                del r[i]
    if left_out:
        notes.append(f"left out for the terminal's width: {', '.join(left_out)} (--csv or --json has them)")
    out = Table(
        title=f"GPU-hours by {grouped}",
        title_justify="left",
        caption="alloc: held by a job; idle alloc: held and not busy; starved: held, waiting for data; "
        + "; ".join(notes),
        caption_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    for (name, _), least in zip(cols, widths, strict=True):
        text = _is_text(name, report.by)
        # a narrow terminal squeezes the names, which fold, and never a figure, which would read as another
        out.add_column(name, justify="left" if text else "right", overflow="fold", no_wrap=not text, min_width=least)
    # Text, not str: a job name, user or tag is anyone's text, and rich would read "[/]" in it as markup
    for row in cells[:-1]:
        out.add_row(*map(Text, row))
    out.add_section()
    out.add_row(*map(Text, cells[-1]), style="bold")
    return out


def _short_gpu_name(name: str | None) -> str | None:
    """The name without its "NVIDIA " ("H100 80GB HBM3"): every GPU here is NVIDIA's."""
    return name.removeprefix("NVIDIA ") if name else name


def _is_text(name: str, by: str) -> bool:
    return name in _TEXT or name == by


def _widest(name: str, values: list[str]) -> int:
    return max(len(line) for line in [*name.split("\n"), *values])


def chart(view: ReportView) -> list[Any]:
    """One line per GPU: a block per step, as high as the GPU was busy, green where a job held it."""
    from rich.text import Text

    step, since, until = view.step_s, view.report.since, view.report.until
    first = since - since % step  # steps start on multiples of themselves, as gpu_series counts them
    cells = math.ceil((until - first) / step)
    width = max(len(s.label) for s in view.series)
    lines = [Text(f"Utilisation per GPU, one block per {span(step)}", style="bold")]
    for series in view.series:
        line = Text(f"{series.label:>{width}} ")
        by_index = {round((p.start - first) / step): p for p in series.points}
        for i in range(cells):
            point = by_index.get(i)
            if point is None or not point.observed_s:
                line.append(" ")
            elif point.busy_share is None:
                line.append("·", style="dim")
            else:
                block = BLOCKS[min(len(BLOCKS) - 1, int(point.busy_share * len(BLOCKS)))]
                held = 2 * point.allocated_s >= point.observed_s
                line.append(block, style="green" if held else "yellow")
        lines.append(line)
    start, end = when(since), when(until)
    gap = max(1, cells - len(start) - len(end))
    lines.append(Text(" " * (width + 1) + start + " " * gap + end, style="dim"))
    lines.append(
        Text(
            " " * (width + 1) + "▁ idle … █ busy; green: held by a job, yellow: not held; · busy unknown; blank: not"
            " recorded",
            style="dim",
        )
    )
    return lines


def findings(report: LedgerReport) -> list[Any]:
    from rich.text import Text

    lines: list[Any] = []
    if report.idle_attempts:
        lines.append(Text("Held GPUs idle longest", style="bold"))
        for a in report.idle_attempts:
            what = f"{hours(a.idle_allocated_gpu_hours)} GPU-h idle of {hours(a.allocated_gpu_hours)} held"
            lines.append(Text(f"  {_attempt(a)}: {what}"))
    if report.starved_attempts:
        lines.append(Text("Most starved (waiting for data)", style="bold"))
        for a in report.starved_attempts:
            what = f"{hours(a.starved_gpu_hours)} GPU-h starved of {hours(a.allocated_gpu_hours)} held"
            lines.append(Text(f"  {_attempt(a)}: {what}"))
    if report.unallocated_hours:
        waited = any(h.jobs_waiting for h in report.unallocated_hours)
        lines.append(Text("Hours when GPUs sat unallocated" + (" while jobs waited" if waited else ""), style="bold"))
        for h in report.unallocated_hours:
            lines.append(Text(f"  {_free_hour(h)}"))
    if not lines:
        lines.append(
            Text(
                "no findings: no job held a GPU idle or starved, and no GPU sat unallocated while a job waited",
                style="dim",
            )
        )
    return lines


def _attempt(a: AttemptFinding) -> str:
    name = f" ({a.name})" if a.name else ""
    attempt = f", attempt {a.attempt}" if a.attempt > 1 else ""
    user = f", {a.user}" if a.user else ""
    return f"job {a.job_id}{name} {a.kind}{attempt}{user}"


def _free_hour(h: UnallocatedHour) -> str:
    gpus = f" (GPU {', '.join(h.gpus)})" if h.gpus else ""
    text = f"{when(h.hour_start)}: {hours(h.unallocated_gpu_hours)} GPU-h unallocated{gpus}"
    if h.jobs_waiting:
        reasons = "; ".join(h.wait_reasons or ())
        jobs = "1 job" if h.jobs_waiting == 1 else f"up to {h.jobs_waiting} jobs"
        text += f" while {jobs} waited" + (f": {reasons}" if reasons else "")
    return text
