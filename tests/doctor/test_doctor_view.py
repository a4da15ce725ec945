"""The human report's list of checks: a long run lists what did not pass, and -v lists all."""

from __future__ import annotations

import io

from rich.console import Console

from gpubox.cli.doctor_view import LONG_RUN, render
from gpubox.doctor.findings import make_report
from gpubox.doctor.model import Check


def report_of(passed: int) -> list[Check]:
    checks = [Check(id="bad", title="broken-thing", category="host", status="fail", detail="it broke", impact=0.5)]
    checks += [
        Check(id=f"ok{i}", title=f"fine-thing-{i}", category="host", status="ok", detail="fine", impact=0.0)
        for i in range(passed)
    ]
    return checks


def rendered(passed: int, verbose: bool) -> str:
    out = io.StringIO()
    render(make_report("doctor", "quick", report_of(passed)), Console(file=out, width=200, no_color=True), verbose)
    return out.getvalue()


def test_a_short_run_lists_every_check() -> None:
    text = rendered(LONG_RUN - 1, verbose=False)
    assert "Every check" in text and "did not pass" not in text
    assert "fine-thing-0 " in text and "broken-thing" in text


def test_a_long_run_lists_what_did_not_pass_and_says_so() -> None:
    text = rendered(LONG_RUN, verbose=False)
    assert "Every check that did not pass (-v lists them all)" in text
    assert "broken-thing" in text and "fine-thing-" not in text
    verbose = rendered(LONG_RUN, verbose=True)
    assert "Every check" in verbose and "did not pass" not in verbose and f"fine-thing-{LONG_RUN - 1} " in verbose


def test_a_run_that_checked_nothing_prints_no_empty_table() -> None:
    """GPU groups on a box without GPUs: the summary says nothing could be checked; a table with
    no rows under it would only look like something failed to print."""
    out = io.StringIO()
    render(make_report("doctor", "quick", []), Console(file=out, width=200, no_color=True), verbose=True)
    text = out.getvalue()
    assert "nothing could be checked" in text
    assert "Every check" not in text and "┏" not in text
    assert "took " in text
