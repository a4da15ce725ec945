"""--since and --until far outside any real window are one line and exit 2, never a traceback."""

from __future__ import annotations

import time

import pytest

from gpubox.cli.report import parse_when
from gpubox.exit_codes import GpuboxError
from tests.helpers import run_gpubox


@pytest.mark.parametrize(
    "when", ["99999999999999999999d", "9999999999999d", "100000d", "1969-12-31T00:00+00:00", "0001-01-01"]
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_window_outside_1970_to_9999_is_a_usage_error(when: str, as_json: bool) -> None:
    args = ["report", "--since", when, *(["--json"] if as_json else [])]
    res = run_gpubox(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "outside 1970 to 9999" in res.stderr and "Traceback" not in res.stderr
    if as_json:
        assert '"exit_code": 2' in res.stdout and '"data": null' in res.stdout


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "ago"),
    [("90m", 5400), ("12h", 43200), ("7d", 7 * 86400), ("2w", 14 * 86400), ("1.5W", 1.5 * 7 * 86400), ("now", 0)],
)
def test_a_time_ago_in_minutes_hours_days_or_weeks(text: str, ago: float) -> None:
    assert parse_when(text, NOW, "--since") == NOW - ago


def test_a_date_is_local_time_unless_it_names_a_zone() -> None:
    assert parse_when("2026-11-01T08:00+00:00", NOW, "--since") == 1_793_520_000.0


def test_the_last_local_minute_of_9999_east_of_greenwich_is_in_range(monkeypatch: pytest.MonkeyPatch) -> None:
    # datetime's local-time arithmetic overflows there, though the moment is 9999-12-31T09:59 UTC
    monkeypatch.setenv("TZ", "UTC-14")  # a POSIX zone 14 hours east: no zone files needed
    time.tzset()
    try:
        assert parse_when("9999-12-31T23:59", NOW, "--until") == 253_402_300_800.0 - 14 * 3600 - 60
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("text", ["1700002800", "3600", "-5", "2.5"])
def test_a_bare_number_is_refused_rather_than_guessed(text: str) -> None:
    with pytest.raises(GpuboxError, match="give a unit"):
        parse_when(text, NOW, "--since")


@pytest.mark.parametrize("text", ["\u0661w", "\u0662h"])  # other scripts' digits: \d and float() take them
def test_digits_are_ascii(text: str) -> None:
    with pytest.raises(GpuboxError):
        parse_when(text, NOW, "--since")
