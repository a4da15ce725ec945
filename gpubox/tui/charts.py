"""Text graphs of a series: one-line sparklines for the panels, taller graphs for the detail view.

A missing figure (None) is a gap, never drawn as 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

BLOCKS = " ▁▂▃▄▅▆▇█"
GAP = " "


def _tail(values: Iterable[float | None], width: int) -> list[float | None]:
    # a NaN or infinity is no figure: a gap, not a crash in round()
    values = [v if v is None or math.isfinite(v) else None for v in values]
    return values[-width:] if width > 0 else []


def scale_top(values: Sequence[float | None], floor: float) -> float:
    """The top of an autoscaled axis: the largest value, but never below `floor`."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    return max([floor, *present])


def _level(value: float, top: float, steps: int) -> int:
    return round(steps * min(max(value, 0.0), top) / top) if top > 0 else 0


def sparkline(values: Iterable[float | None], width: int, top: float) -> str:
    """The last `width` values as one line of eighth blocks, left-padded to `width`."""
    tail = _tail(values, width)
    cells = []
    for v in tail:
        if v is None:
            cells.append(GAP)
        else:
            # zero still draws the baseline block, so a measured 0 is told from a gap
            cells.append(BLOCKS[max(1, _level(v, top, 8))])
    return " " * (width - len(cells)) + "".join(cells)


def graph(values: Iterable[float | None], width: int, height: int, top: float) -> list[str]:
    """The last `width` values as `height` rows of bars, top row first."""
    tail = _tail(values, width)
    pad = width - len(tail)
    eighths = [None if v is None else _level(v, top, 8 * height) for v in tail]
    rows = []
    for row in range(height - 1, -1, -1):
        base = 8 * row
        line = [" " * pad]
        for e in eighths:
            if e is None:
                line.append(GAP)
            elif e >= base + 8:
                line.append(BLOCKS[8])
            elif e > base:
                line.append(BLOCKS[e - base])
            else:
                line.append("▁" if row == 0 else " ")
        rows.append("".join(line))
    return rows
