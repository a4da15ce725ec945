"""Lengths of time in messages, written as `--time-limit` takes them."""

from __future__ import annotations

import pytest

from gpubox.format import span
from gpubox.queue.parse import parse_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (60, "1m"), (90, "1m30s"), (600, "10m"), (601, "10m1s"), (7200, "2h"), (5400, "1h30m"),
     (90061, "1d1h1m1s"), (172800, "2d"), (1.5, "1.5s"), (0.25, "0.25s")],
)  # fmt: skip
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text
    assert parse_duration(text, zero=True) == pytest.approx(seconds)  # what a user can type back


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0B"),
        (1023, "1023B"),
        (1023.6, "1.0KiB"),  # would round to 1024B
        (1024, "1.0KiB"),
        (1023.96 * 1024, "1.0MiB"),  # would round to 1024.0KiB
        (1023.94 * 1024, "1023.9KiB"),
        (1.5 * 1024**3, "1.5GiB"),
        (2048 * 1024**4, "2048.0TiB"),  # the largest unit takes any size
    ],
)
def test_size_never_shows_1024_of_a_unit(value: float, text: str) -> None:
    from gpubox.format import size

    assert size(value) == text
