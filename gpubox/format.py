"""Short human renderings of figures, shared by the table output and the live view.

A missing figure is an en dash, never 0.
"""

from __future__ import annotations

import time

DASH = "–"


def pct(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}%"


def fraction_pct(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.0f}%"


def size(value: float | None) -> str:
    if value is None:
        return DASH
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        # Compared as shown: 1023.96 KiB is 1.0MiB, not "1024.0KiB".
        if abs(round(value, 0 if unit == "B" else 1)) < 1024 or unit == "TiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return DASH  # unreachable


def rate(value: float | None) -> str:
    return DASH if value is None else f"{size(value)}/s"


def watts(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}W"


def temp(value: float | None) -> str:
    return DASH if value is None else f"{value:.0f}°C"


def mhz(value: int | None) -> str:
    return DASH if value is None else f"{value}MHz"


def events(reasons: tuple[str, ...] | None) -> str:
    """Clock event (throttle) reasons: "none" when the driver says none, a dash when unknown."""
    if reasons is None:
        return DASH
    return ",".join(reasons) or "none"


def link(gen: int | None, width: int | None, gen_max: int | None, width_max: int | None) -> str:
    def one(g: int | None, w: int | None) -> str:
        return f"Gen{g if g is not None else '?'} x{w if w is not None else '?'}"

    if gen is None and width is None:
        return DASH
    return f"{one(gen, width)}/{one(gen_max, width_max)}"


def uptime(start: float | None, now: float | None = None) -> str:
    if start is None:
        return DASH
    secs = max(0, int((now if now is not None else time.time()) - start))
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{mins:02d}m"
    return f"{mins}m{secs:02d}s"


def job(job_id: int | None, kind: str | None) -> str:
    """The gpubox queue job a process belongs to, as "12 train"; a dash for none."""
    if job_id is None:
        return DASH
    return f"{job_id} {kind}" if kind else str(job_id)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """Text as a terminal may be given it: control characters (a newline, an escape sequence
    that would clear the screen) and text that is not UTF-8 shown escaped, so one value stays
    on one line and says what it holds."""
    if text.isprintable():
        return text  # the common case, at C speed (a space is printable; a newline is not)
    out = []
    for c in text:
        o = ord(c)
        if c.isprintable() or c == " ":
            out.append(c)
        elif c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")  # a byte that was not UTF-8 (surrogateescape)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        else:
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
    return "".join(out)


def span(seconds: float) -> str:
    """A length of time as people write one, exactly: 45s, 1m30s, 2h, 1h30m, 3d2h (1.5s below a
    minute); the units `--time-limit` takes."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:.3g}s"
    left = int(seconds)
    parts = []
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= length:
            parts.append(f"{left // length}{unit}")
            left %= length
    return "".join(parts) or "0s"
