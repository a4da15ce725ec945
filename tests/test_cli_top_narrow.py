"""`gpubox top --once` fits the terminal's width (or COLUMNS): the least needed columns leave
first, a figure is never cut, only a GPU's name and the command, with an ellipsis."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from gpubox import format as fmt
from gpubox.cli.top_table import GPU_COLUMNS, PROCESS_COLUMNS, render_tables
from gpubox.telemetry.simulated import SimulatedBackend
from tests.helpers import run_gpubox


def rendered(width: int) -> tuple[list[str], SimulatedBackend]:
    box = SimulatedBackend(gpus=4, processes=12, clock=lambda: 1_700_000_000.0)
    box.sample()
    snap = box.sample()
    out = io.StringIO()
    render_tables(snap, Console(file=out, width=width, color_system=None), 0.2)
    return out.getvalue().splitlines(), box


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160, 250])
def test_every_line_fits_and_the_figures_are_whole(width: int) -> None:
    lines, box = rendered(width)
    assert all(cell_len(line) <= width for line in lines)
    header = next(line for line in lines if line.lstrip().startswith("PID "))
    for kept in ("PID", "SM", "GPU mem", "Loader wait", "Command"):
        assert kept in header
    gpu_header = next(line for line in lines if line.startswith("GPU "))
    for kept in ("Busy", "SM act", "Mem", "PCIe RX"):
        assert kept in gpu_header
    snap = box.sample()  # the processes' figures move; their pids and users do not
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 1 :]}
    assert set(rows) == {str(p.pid) for p in snap.processes}
    at = header.index("Command")
    for row in rows.values():
        assert "…" not in row[:at]  # only the command is ever cut


def test_all_columns_at_250() -> None:
    lines, _ = rendered(250)
    assert all(col in "\n".join(lines) for col in (*GPU_COLUMNS, *PROCESS_COLUMNS))
    assert "…" not in next(line for line in lines if "vllm" in line)


def test_columns_narrows_a_piped_table() -> None:
    res = run_gpubox("top", "--once", "--demo", "--no-color", "--interval", "0.05", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert all(cell_len(line) <= 80 for line in res.stdout.splitlines())
    assert fmt.DASH in res.stdout and "Loader wait" in res.stdout and "Uptime" not in res.stdout


def test_columns_that_are_not_a_width_are_ignored() -> None:
    # A superscript 2 passes str.isdigit(), and int() refuses it: no traceback, the usual width.
    res = run_gpubox("top", "--once", "--demo", "--no-color", "--interval", "0.05", env={"COLUMNS": "\u00b2"})
    assert res.returncode == 0 and res.stderr == "", res.stderr


def test_columns_that_are_not_a_width_still_reach_what_gpubox_runs() -> None:
    # Taken out of gpubox's own environment for Rich's sake, but the user's: `gpubox run` passes it on.
    res = run_gpubox("run", "sh", "-c", 'printf "%s|%s" "$COLUMNS" "$LINES"', env={"COLUMNS": "\u00b2", "LINES": "x"})
    assert res.returncode == 0, res.stderr
    assert res.stdout == "\u00b2|x"
