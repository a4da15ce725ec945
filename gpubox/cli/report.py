"""`gpubox report`: where the GPU hours went. Thin: parse the window and prices, read the ledger
through gpubox.ledger, and hand the result to the rich view, the JSON envelope or CSV."""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from gpubox.cli.output import console, print_json, print_json_failure
from gpubox.exit_codes import ExitCode, GpuboxError

if TYPE_CHECKING:  # the ledger and rich load when the command runs, not with `gpubox --help`
    from gpubox.ledger.report import LedgerReport, Prices
    from gpubox.ledger.store import LedgerStore

NO_LEDGER = "no GPU use recorded yet: the gpubox daemon records it while it runs (gpubox daemon status)"
WHEN_FORMS = (
    "a time ago such as 2w, 7d, 12h or 90m, a date such as 2026-11-01, a date and time such as 2026-11-01T08:00, or now"
)
_TAG_KEY = re.compile(r"[A-Za-z0-9_.\-]+")  # as `queue add --tag` accepts keys


@dataclass(frozen=True)
class ReportRequest:
    since: float
    until: float
    by: str
    tag_key: str | None
    now: float


def report(
    since: Annotated[
        str,
        typer.Option(
            "--since",
            metavar="WHEN",
            help="Start of the window: a time ago (7d, 12h, 90m), a date (2026-11-01) or a date and time"
            " (2026-11-01T08:00, local time unless it names a zone).",
        ),
    ] = "7d",
    until: Annotated[
        str, typer.Option("--until", metavar="WHEN", help="End of the window, in the same forms, or now.")
    ] = "now",
    by: Annotated[
        str | None,
        typer.Option(
            "--by", metavar="GROUPING", help="Rows by gpu (the default), job, kind, tag or user.", show_default=False
        ),
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option(
            "--tag", metavar="KEY", help="With --by tag: one row per value of this tag key.", show_default=False
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (schema 1) instead of text.")
    ] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV, for spreadsheets.")] = False,
    price_per_gpu_hour: Annotated[
        float | None,
        typer.Option(
            "--price-per-gpu-hour", metavar="PRICE", help="Cost of one GPU-hour (default: report.gpu_hour_price)."
        ),
    ] = None,
    price_per_kwh: Annotated[
        float | None,
        typer.Option("--price-per-kwh", metavar="PRICE", help="Cost of one kWh (default: report.kwh_price)."),
    ] = None,
    no_color: Annotated[bool, typer.Option("--no-color", help="No colour, even on a terminal.")] = False,
) -> None:
    """Where the GPU hours went: calendar, allocated, busy, idle while allocated, starved, energy, cost.

    Reads the ledger that the gpubox daemon records while it runs. Calendar GPU-hours are every
    GPU's wall-clock time in the window; allocated, the hours queue jobs held; busy, by sm_active
    where GPM gives it, else gpu_busy; idle while allocated, held by a job and not busy; starved,
    held while the job waited for data (its loader_wait). With a price per GPU-hour, --by gpu
    costs the calendar hours and the other groupings the allocated ones; a price per kWh adds
    the energy. Below the table: utilisation over time per GPU, the jobs that held GPUs idle
    longest, the most starved jobs, and the hours when GPUs sat unallocated while jobs waited.

    --by tag without --tag has one row per key=value pair (a job with two tags counts in both) and
    one "(untagged)"; with --tag KEY, one row per value of that key, and one "(no KEY tag)" for
    jobs without it. Whole hours that overlap the window count for job, kind, tag and user; by
    gpu, a minute the window cuts counts for its part inside the window.

    Exit codes: 0 ok, 1 no ledger yet or it cannot be read, 2 bad input, 3 no ledger and no NVML.
    """
    try:
        if as_json and as_csv:
            raise GpuboxError("--json and --csv cannot be used together", ExitCode.USAGE)
        request = parse_request(since, until, by, tag)
        prices, color = _settings(price_per_gpu_hour, price_per_kwh, no_color)
        if as_json or as_csv:
            _print_data(request, prices, as_json)
        else:
            _print_human(request, prices, color)
    except GpuboxError as exc:
        if as_json and not as_csv:  # a script asked for JSON: it gets an envelope on failure too
            print_json_failure("report", exc.code, [exc.message])
        raise


LATEST = 253_402_300_800.0  # 10000-01-01 UTC
_BARE_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?")  # [0-9]: \d takes other scripts' digits too
_WEEKS = re.compile(r"([0-9]+(?:\.[0-9]+)?)w", re.IGNORECASE)


def parse_when(text: str, now: float, option: str) -> float:
    """Seconds since the epoch from "now", an ISO date or date-time (local time unless it names
    a zone), or a duration ago."""
    from gpubox.queue.parse import parse_duration

    value = text.strip()
    if value.lower() == "now":
        return now
    when: float | None = None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        if _BARE_NUMBER.fullmatch(value):  # seconds ago, or a Unix time? Neither is a guess worth making
            raise GpuboxError(
                f"invalid {option} {text!r}: give a unit (such as 90m or 7d) or a date", ExitCode.USAGE
            ) from None
        weeks = _WEEKS.fullmatch(value)
        try:
            when = now - (float(weeks[1]) * 7 * 86400 if weeks else parse_duration(value, longest=None))
        except (ValueError, OverflowError):
            raise GpuboxError(f"invalid {option} {text!r}: expected {WHEN_FORMS}", ExitCode.USAGE) from None
    else:
        when = _timestamp(moment)
    # Local time and SQLite's integers both end somewhere: a window from 1970 to the year 9999 is plenty.
    if not 0 <= when < LATEST:
        raise GpuboxError(f"{option} {text!r} is outside 1970 to 9999", ExitCode.USAGE)
    return when


def _timestamp(moment: datetime) -> float:
    """Seconds since the epoch of a date-time, local time unless it names a zone; out of range
    (before 1970 or after 9999) where local time cannot place it, as for 0001-01-01."""
    try:
        return (moment if moment.tzinfo is not None else moment.astimezone()).timestamp()
    except (ValueError, OverflowError, OSError):
        pass
    try:  # datetime's own arithmetic overflows near the year 9999; the C library's may not
        return time.mktime(moment.timetuple()) + moment.microsecond / 1e6
    except (ValueError, OverflowError, OSError):
        return -1.0 if moment.year < 1970 else LATEST


def parse_request(since: str, until: str, by: str | None, tag: str | None, now: float | None = None) -> ReportRequest:
    from gpubox.ledger.report import GROUPINGS

    now = time.time() if now is None else now
    grouping = by.strip().lower() if by is not None else ("tag" if tag is not None else "gpu")
    if grouping not in GROUPINGS:
        raise GpuboxError(f"--by must be one of {', '.join(GROUPINGS)}, not {by!r}", ExitCode.USAGE)
    if tag is not None and grouping != "tag":
        raise GpuboxError(f"--tag KEY groups --by tag; it does not apply to --by {grouping}", ExitCode.USAGE)
    if tag is not None and not _TAG_KEY.fullmatch(tag):
        raise GpuboxError(
            f"invalid --tag {tag!r}: expected a tag key (ASCII letters, digits, '_', '.' or '-'), such as team",
            ExitCode.USAGE,
        )
    start, end = parse_when(since, now, "--since"), parse_when(until, now, "--until")
    if not end > start:
        raise GpuboxError(f"--since ({since}) must be earlier than --until ({until})", ExitCode.USAGE)
    return ReportRequest(start, end, grouping, tag, now)


def _settings(per_gpu_hour: float | None, per_kwh: float | None, no_color: bool) -> tuple[Prices, bool]:
    """Prices from the flags, else the config; and whether to colour."""
    from gpubox.cli.settings import load_settings
    from gpubox.config import MAX_PRICE
    from gpubox.ledger.report import Prices

    for flag, price in (("--price-per-gpu-hour", per_gpu_hour), ("--price-per-kwh", per_kwh)):
        if price is not None and not (math.isfinite(price) and 0 <= price <= MAX_PRICE):
            raise GpuboxError(f"{flag} must be a price from 0 to 1000000000, not {price:g}", ExitCode.USAGE)
    flags = {"report.gpu_hour_price": per_gpu_hour, "report.kwh_price": per_kwh, "color": False if no_color else None}
    cfg = load_settings(flags)
    return Prices(cfg.get("report.gpu_hour_price"), cfg.get("report.kwh_price")), bool(cfg.get("color"))


def open_ledger() -> LedgerStore:
    """The ledger, to read; exit 1 (or 3 without NVML) when it has nothing recorded, whether no
    daemon has made it yet or one has and not yet written its first minute."""
    from gpubox.ledger.store import LedgerError, LedgerStore, ledger_exists, ledger_path

    path = ledger_path()
    try:
        if not ledger_exists(path):
            _nothing_recorded()
        store = LedgerStore(path, create=False)
    except LedgerError as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    try:
        recorded = "last_sample_at" in store.meta()
    except LedgerError as exc:
        store.close()
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    if not recorded:
        store.close()
        _nothing_recorded()
    return store


def _nothing_recorded() -> NoReturn:
    from gpubox.telemetry.backend import BackendUnavailable
    from gpubox.telemetry.nvml_load import load_nvml

    try:
        load_nvml()
    except BackendUnavailable as exc:  # the daemon runs, maybe, but has no GPU to record
        raise GpuboxError(f"no GPU use recorded: NVML cannot start here ({exc})", ExitCode.NO_GPU) from None
    raise GpuboxError(NO_LEDGER, ExitCode.FAILED)


def _reports(store: LedgerStore, request: ReportRequest, prices: Prices) -> tuple[LedgerReport, LedgerReport]:
    """The report as grouped, and by gpu (the calendar and the summary line, whatever the grouping)."""
    from gpubox.ledger.findings import StoredWaits
    from gpubox.ledger.report import build_report

    r = request
    grouped = build_report(
        store, r.since, r.until, r.by, prices=prices, tag_key=r.tag_key, now=r.now, waits=StoredWaits(store)
    )
    if r.by == "gpu":
        return grouped, grouped
    return grouped, build_report(store, r.since, r.until, "gpu", prices=prices, now=r.now, limit=0)


def _print_data(request: ReportRequest, prices: Prices, as_json: bool) -> None:
    from gpubox.cli.report_view import cards, write_csv
    from gpubox.envelope import to_jsonable

    with _ledger_errors(), open_ledger() as store, store.reading():  # one state for every part
        grouped, by_gpu = _reports(store, request, prices)
    if not as_json:
        write_csv(grouped.rows, sys.stdout)
        return
    data: dict[str, Any] = to_jsonable(grouped)
    data["gpu_count"] = cards(by_gpu)
    data["gpu_total"] = to_jsonable(by_gpu.total)
    print_json("report", data)


def _print_human(request: ReportRequest, prices: Prices, color: bool) -> None:
    from gpubox.cli.report_view import ReportView, chart_columns, chart_step, render
    from gpubox.ledger.rollup import HOUR
    from gpubox.ledger.series import gpu_series, shortest_step

    out = console(color)
    with _ledger_errors(), open_ledger() as store, store.reading():  # table, summary and chart agree
        grouped, by_gpu = _reports(store, request, prices)
        label_width = max((len(r.group) for r in by_gpu.rows), default=1)
        columns = chart_columns(out.width, label_width)
        step = chart_step(request.since, request.until, columns)
        if step < HOUR:  # steps under an hour read minutes: where retention dropped them, hours it is
            step = chart_step(request.since, request.until, columns, shortest_step(store, request.since, request.until))
        series = gpu_series(store, request.since, request.until, step)
    render(ReportView(grouped, by_gpu, series, step), out)


@contextmanager
def _ledger_errors() -> Iterator[None]:
    """A ledger that fails while being read is one line and exit 1; arguments the core refuses,
    one line and exit 2."""
    from gpubox.ledger.store import LedgerError

    try:
        yield
    except LedgerError as exc:
        raise GpuboxError(str(exc), ExitCode.FAILED) from None
    except ValueError as exc:
        raise GpuboxError(str(exc), ExitCode.USAGE) from None


def job_usage_record(job_id: int) -> tuple[dict[str, Any] | None, str | None]:
    """One queue job's GPU use for `queue show` (its JSON `usage`), None when the ledger has none;
    and why it is not shown when the ledger cannot be read (also said on stderr)."""
    from gpubox.envelope import to_jsonable
    from gpubox.ledger.attempt_lookup import recorded_job_usage
    from gpubox.ledger.store import LedgerError

    try:
        usage = recorded_job_usage(job_id)
    except LedgerError as exc:
        error = f"GPU use not shown: {exc}"
        sys.stderr.write(f"gpubox: {error}\n")
        return None, error
    return (to_jsonable(usage) if usage is not None else None), None
