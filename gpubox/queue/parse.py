"""Strict parsers for `queue` option values.

Each parser takes the text a user typed and returns a plain value, or raises ValueError with
one line that names the bad value and says what was expected.
"""

from __future__ import annotations

import math
import re

from gpubox.queue.jobs import KINDS, has_control

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"  # not \d, which takes other scripts' digits too
_DURATION_RE = re.compile(rf"(?:(?P<d>{_NUMBER})d)?(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?")
_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SIZE_RE = re.compile(rf"(?P<num>{_NUMBER})(?P<unit>[KMGT]?)(?:I?B)?")
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_TAG_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ID_RE = re.compile(r"[0-9]+")


LONGEST_S = 36500 * 86400.0


def parse_duration(text: str, zero: bool = False, longest: float | None = LONGEST_S) -> float:
    """Seconds from "90s", "15m", "2h", "1h30m", "7d" or a bare number of seconds; `zero`: 0 is
    one too (a wait that only looks, a clean of every finished job), never for a time limit.
    `longest`: None for a caller that bounds the result itself (report's dates)."""
    value = text.strip().lower()
    least = "a" if zero else "a positive"
    expected = f"expected {least} duration such as 90s, 15m, 2h, 1h30m, 7d or 45"
    if re.fullmatch(_NUMBER, value):
        seconds = float(value)
    else:
        match = _DURATION_RE.fullmatch(value)
        if not value or match is None or not any(match.groupdict().values()):
            raise ValueError(f"invalid duration {text!r}: {expected}")
        seconds = sum(
            float(amount) * _DURATION_UNITS[unit] for unit, amount in match.groupdict().items() if amount is not None
        )
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"invalid duration {text!r}: {expected}")
    if longest is not None and seconds > longest:  # past this a float no longer holds whole seconds
        raise ValueError(f"invalid duration {text!r}: at most 36500d (100 years)")
    return seconds


def parse_size(text: str) -> int:
    """Bytes from "40G", "40GiB", "512M", "1.5G" or a bare number of bytes (multiples of 1024)."""
    value = text.strip().upper()
    expected = "expected a positive size such as 40G, 40GiB, 512M or 1000000 (bytes)"
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"invalid size {text!r}: {expected}")
    from decimal import Decimal, InvalidOperation  # here: most jobs give no size

    try:
        amount = Decimal(match["num"]) * _SIZE_UNITS[match["unit"]]
    except InvalidOperation:
        raise ValueError(f"invalid size {text!r}: {expected}") from None
    size = math.ceil(amount)
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: {expected}")
    return size


def parse_tag(text: str) -> tuple[str, str]:
    """A (key, value) pair from "key=value"; the key is ASCII letters, digits, _ . -; value non-empty."""
    key, sep, value = text.partition("=")
    if not sep or not _TAG_KEY_RE.fullmatch(key) or not value:
        raise ValueError(
            f"invalid tag {text!r}: expected key=value, the key made of ASCII letters, digits, "
            "'_', '.' or '-', and a non-empty value"
        )
    if has_control(value):  # a report's row, a metric's label: one line, as a name is
        raise ValueError(f"invalid tag {text!r}: expected a value on one line, with no control characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 on the command line
        raise ValueError(f"invalid tag {text!r}: expected UTF-8 text") from None
    return key, value


def parse_env(text: str) -> tuple[str, str]:
    """A (name, value) pair from "NAME=value"; the value may be empty."""
    name, sep, value = text.partition("=")
    if not sep or not _ENV_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid environment variable {text!r}: expected NAME=value with NAME "
            "made of ASCII letters, digits and '_', not starting with a digit"
        )
    return name, value


def parse_ids(text: str) -> tuple[int, ...]:
    """Job ids from "3,5, 8": positive integers, comma-separated, no duplicates."""
    ids: list[int] = []
    for part in text.split(","):
        piece = part.strip()
        if not _ID_RE.fullmatch(piece) or not 0 < int(piece) < 1 << 63:
            raise ValueError(f"invalid job id {piece!r} in {text!r}: expected positive integers separated by commas")
        job_id = int(piece)
        if job_id in ids:
            raise ValueError(f"duplicate job id {job_id} in {text!r}")
        ids.append(job_id)
    return tuple(ids)


def parse_kind(text: str) -> str:
    """One of the job kinds, case-insensitive."""
    kind = text.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown kind {text!r}: expected one of {', '.join(KINDS)}")
    return kind
