"""The live view's pure pieces: graphs, the filter, interval steps, grid shape, panel text."""

from __future__ import annotations

import dataclasses

from gpubox.telemetry.model import ProcessSnapshot
from gpubox.tui.charts import graph, scale_top, sparkline
from gpubox.tui.gpu_panel import WARN, downtrained, grid_columns, panel_text
from gpubox.tui.history import BoxHistory
from gpubox.tui.poller import MAX_INTERVAL, MIN_INTERVAL, faster, slower
from gpubox.tui.process_filter import ProcessFilter
from gpubox.tui.reasons import why_missing
from tests.tui.conftest import sim


def test_sparkline_scales_pads_and_leaves_gaps() -> None:
    assert sparkline([0, 50, None, 100, 400], 8, 100) == "   ▁▄ ██"
    assert sparkline(range(20), 4, 19) == "▇▇██"  # only the last `width` values
    assert sparkline([], 3, 1) == "   "


def test_a_nan_or_infinite_figure_is_a_gap_not_a_crash() -> None:
    nan, inf = float("nan"), float("inf")
    assert sparkline([nan, 50, inf], 3, 100) == " ▄ "
    assert graph([nan, 100, -inf], 3, 1, 100) == [" █ "]
    assert scale_top([nan, inf, 3.0], 1.0) == 3.0


def test_graph_stacks_rows_top_first() -> None:
    assert graph([100, 50, None, 0], 4, 2, 100) == ["█   ", "██ ▁"]
    assert graph([25], 1, 2, 100) == [" ", "▄"]


def test_scale_top_has_a_floor() -> None:
    assert scale_top([None, 3.0, 7.0], 1.0) == 7.0
    assert scale_top([None, 0.1], 1.0) == 1.0


def proc(user: str, command: str, gpu: int = 0, uuid: str = "GPU-aaaa") -> ProcessSnapshot:
    return ProcessSnapshot(1, gpu, uuid, "compute", user=user, command=command)


def test_filter_terms() -> None:
    flt = ProcessFilter.parse("user:alice  gpu:1 TRAIN")
    assert flt.users == {"alice"} and flt.gpus == {"1"} and flt.words == ("train",)
    assert flt.matches(proc("alice", "python train.py", 1), "1")
    assert not flt.matches(proc("bob", "python train.py", 1), "1")
    assert not flt.matches(proc("alice", "python train.py", 0), "0")
    assert not flt.matches(proc("alice", "python eval.py", 1), "1")
    assert not ProcessFilter.parse("  ")
    assert ProcessFilter.parse("gpu:0/3").matches(proc("a", "x", 0), "0/3")
    assert not ProcessFilter.parse("gpu:0/3").matches(proc("a", "x", 0), "0/2")
    assert ProcessFilter.parse("gpu:GPU-AA").matches(proc("a", "x", 5), "5")
    assert ProcessFilter.parse("user:").words == ("user:",)  # an empty term is a plain word


def test_interval_steps_stay_in_bounds() -> None:
    assert faster(1.0) == 0.5 and slower(1.0) == 2.0
    assert faster(MIN_INTERVAL) == MIN_INTERVAL and slower(MAX_INTERVAL) == MAX_INTERVAL
    assert faster(0.05) == 0.05  # a faster interval from the config is kept, never made slower by +
    assert slower(0.05) == MIN_INTERVAL and faster(30.0) == MAX_INTERVAL


def test_grid_columns_fit_the_width_with_balanced_rows() -> None:
    assert grid_columns(1, 120) == 1
    assert grid_columns(4, 120) == 4
    assert grid_columns(4, 80) == 2
    assert grid_columns(8, 120) == 4
    assert grid_columns(5, 120) == 3  # two rows of 3 and 2, not 4 and 1
    assert grid_columns(8, 20) == 1


def test_reasons_in_a_few_words() -> None:
    assert why_missing({"sm_occupancy": "not_supported"}, "sm_occupancy") == "n/a: no GPM"
    assert why_missing({"power_w": "not_supported"}, "power_w") == "n/a"
    assert why_missing({"pcie_rx_Bps": "warming_up"}, "pcie_rx_Bps") == "warming up"
    assert why_missing({}, "anything") == "n/a"


def test_a_downtrained_link_is_flagged_in_the_warning_colour() -> None:
    box = sim(3, 0)
    history = BoxHistory()
    for _ in range(3):
        snap = box.sample()
        history.record(snap)
    gpu = dataclasses.replace(snap.gpus[0], gpu_busy=90.0)
    slow = dataclasses.replace(gpu, pcie_link_gen=1, pcie_link_gen_max=5)
    narrow = dataclasses.replace(gpu, pcie_link_gen=5, pcie_link_gen_max=5, pcie_link_width=8)
    full = dataclasses.replace(gpu, pcie_link_gen=5, pcie_link_gen_max=5, pcie_link_width=16)
    assert downtrained(slow) and downtrained(narrow) and not downtrained(full)
    text = panel_text(slow, history.gpus[gpu.uuid], 40)
    start = text.plain.index("Gen1 x16/Gen5 x16")
    assert any(span.start <= start < span.end and span.style == WARN for span in text.spans)
    text = panel_text(full, history.gpus[gpu.uuid], 40)
    start = text.plain.index("Gen5 x16/Gen5 x16")
    assert not any(span.start <= start < span.end and span.style == WARN for span in text.spans)


def test_an_idle_gpus_slow_link_is_not_flagged() -> None:
    # An idle GPU drops to Gen1 on purpose: flagging it would mark every idle GPU of a box.
    box = sim(3, 0)
    history = BoxHistory()
    snap = box.sample()
    history.record(snap)
    gpu = snap.gpus[0]
    resting = dataclasses.replace(gpu, gpu_busy=0.0, pcie_link_gen=1, pcie_link_gen_max=5)
    unknown = dataclasses.replace(resting, gpu_busy=None)
    assert not downtrained(resting) and not downtrained(unknown)
    text = panel_text(resting, history.gpus[gpu.uuid], 40)
    start = text.plain.index("Gen1 x16/Gen5 x16")
    assert "↓" not in text.plain
    assert not any(span.start <= start < span.end and span.style == WARN for span in text.spans)


def test_history_is_bounded_and_forgets_what_left() -> None:
    box = sim(2, 6)
    history = BoxHistory(length=5)
    for _ in range(9):
        snap = box.sample()
        history.record(snap)
    assert all(len(h.gpu_busy) == 5 for h in history.gpus.values())
    assert len(history.processes) == 6
    box.send_signal(snap.processes[0].pid, 15, None)
    history.record(box.sample())
    assert len(history.processes) == 5
