"""The process table of the live view: its rows, their order, the filter, and in-place updates."""

from __future__ import annotations

from gpubox import format as fmt
from gpubox.tui.process_table import ProcessTable, row_key
from gpubox.tui.top_app import TopApp
from tests.tui.conftest import keys_in_one_read, reference, settle, sim, wait_until

SIZE = (120, 40)


def cells(table: ProcessTable, column: str) -> list[str]:
    return [str(c) for c in table.get_column(column)]


async def test_one_row_per_process_with_its_figures() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 3)
        table = app.table
        ref = reference(2, 6, app.refreshes)
        assert table.row_count == 6
        for proc in ref.processes:
            key = row_key(proc)
            assert str(table.get_cell(key, "pid")) == str(proc.pid)
            assert str(table.get_cell(key, "sm")) == fmt.pct(proc.sm_util)
            assert str(table.get_cell(key, "mem")) == fmt.size(proc.gpu_mem_bytes)
            assert str(table.get_cell(key, "user")) == proc.user
            loader = str(table.get_cell(key, "loader"))
            if proc.loader_wait is None:
                assert loader == "–"  # not measured is not 0
            else:
                assert loader == ("~" if proc.loader_wait_source == "sampled" else "") + fmt.fraction_pct(
                    proc.loader_wait
                )
            assert str(table.get_cell(key, "uptime")) == fmt.uptime(proc.start_time, ref.taken_at)
            assert str(table.get_cell(key, "job")) == fmt.job(proc.job_id, proc.job_kind)
        jobs = sorted(str(c) for c in table.get_column("job"))
        assert jobs == ["12 train", "14 quantize", "15 train", "16 batch", "–", "–"]


async def test_s_sorts_by_the_next_column_and_S_reverses() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 3)
        table = app.table
        by_gpu = cells(table, "pid")
        assert table.sort_column == "gpu"
        await pilot.press("s", "s")  # gpu -> user -> SM %
        assert table.sort_column == "sm"
        assert app.snapshot is not None
        by_sm = [str(p.pid) for p in sorted(app.snapshot.processes, key=lambda p: -(p.sm_util or 0))]
        assert cells(table, "pid") == by_sm != by_gpu
        await pilot.press("S")
        assert cells(table, "pid") == by_sm[::-1]
        assert "SM % ▲" in app.query_one("#status").plain  # type: ignore[attr-defined]


async def test_clicking_a_header_sorts_by_it_and_again_reverses() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        table = app.table
        await pilot.click(ProcessTable, offset=(3, 0))  # the PID header
        await pilot.pause()
        assert table.sort_column == "pid"
        pids = cells(table, "pid")
        assert pids == sorted(pids, key=int)
        await pilot.click(ProcessTable, offset=(3, 0))
        await pilot.pause()
        assert cells(table, "pid") == sorted(pids, key=int, reverse=True)


async def test_the_order_holds_as_figures_change() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 1, "a refresh")
        await pilot.press("s", "s")
        seen = app.refreshes
        await wait_until(pilot, lambda: app.refreshes >= seen + 3, "three more refreshes")
        await settle(pilot, app, 0)
        assert app.snapshot is not None
        by_sm = [str(p.pid) for p in sorted(app.snapshot.processes, key=lambda p: -(p.sm_util or 0))]
        assert cells(app.table, "pid") == by_sm


async def test_filter_by_user_gpu_and_words() -> None:
    app = TopApp(sim(2, 12), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 2)
        table = app.table
        await pilot.press("slash", *"user:alice")
        assert set(cells(table, "user")) == {"alice"}
        assert table.row_count == 2  # processes 0 and 6 of 12 belong to alice
        await pilot.press("enter")
        assert app.focused is table
        assert "filter: user:alice (2 shown)" in app.query_one("#status").plain  # type: ignore[attr-defined]
        await pilot.press("escape")
        assert table.row_count == 12
        await pilot.press("slash", *"gpu:1", "enter")
        assert set(cells(table, "gpu")) == {"1"}
        assert table.row_count == 6
        await pilot.press("escape", "slash", *"VLLM", "enter")
        assert {str(c) for c in table.get_column("user")} == {"bob"}
        await pilot.press("escape", "slash", *"user:alice gpu:1", "enter")
        assert table.row_count == 0


async def test_typing_in_the_filter_does_not_trigger_keys() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 1)
        await pilot.press("slash", *"qsk p")
        assert app.is_running
        assert app.query_one("#filter").value == "qsk p"  # type: ignore[attr-defined]
        assert app.poller.paused  # space went into the box, it did not resume sampling


async def test_keys_read_in_one_go_act_in_the_order_typed() -> None:
    # Over a slow link, typed fast, or during a long redraw, keys arrive in one read. Each must
    # act in turn: the letters after "/" go to the box (s sorted the table and the rest vanished),
    # a backspace or C-u edits what was typed before it, not after, and after Enter the table has
    # the keys again.
    app = TopApp(sim(2, 12), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 1)
        box = app.query_one("#filter")
        sent = ["slash", *"a/x", "ctrl+u", *"user:bbx", "backspace", "left", "o", "right", "enter", "s"]
        keys_in_one_read(app, *sent)
        await wait_until(pilot, lambda: app.table.sort_column != "gpu", "the s after Enter to sort the table")
        assert box.value == "user:bob"  # type: ignore[attr-defined]
        assert app.focused is app.table
        assert "filter: user:bob (2 shown)" in app.query_one("#status").plain  # type: ignore[attr-defined]

        keys_in_one_read(app, "/", "escape", "S")
        await wait_until(pilot, lambda: app.table.reverse, "the S after Escape to reverse the table")
        assert box.value == ""  # type: ignore[attr-defined]
        assert app.table.row_count == 12


async def test_keys_read_with_a_slash_before_it_act_on_the_table() -> None:
    # "s/bob" in one read: the s was sent to the table, but came back for its binding once "/"
    # had put the focus in the box, where Textual took it for text and dropped it.
    app = TopApp(sim(2, 12), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, 1)
        keys_in_one_read(app, "s", "S", "/", *"bob")
        box = app.query_one("#filter")
        await wait_until(pilot, lambda: box.value == "bob", "the text in the box")  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: app.table.reverse, "the S before the slash to reverse the sort")
        assert app.table.sort_column != "gpu"  # and the s to sort by the next column
        assert app.focused is box


async def test_rows_are_updated_in_place() -> None:
    app = TopApp(sim(2, 6), interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.refreshes >= 1, "the first refresh")
        table = app.table
        calls = {"clear": 0, "add_row": 0, "update_cell": 0, "unchanged": 0}
        real_add, real_update = table.add_row, table.update_cell

        def clear(*args: object, **kwargs: object) -> ProcessTable:
            calls["clear"] += 1
            raise AssertionError("the process table must not be cleared")

        def add_row(*args: object, **kwargs: object) -> object:
            calls["add_row"] += 1
            return real_add(*args, **kwargs)  # type: ignore[arg-type]

        def update_cell(row: object, column: object, value: object, **kwargs: object) -> None:
            calls["update_cell"] += 1
            if str(table.get_cell(row, column)) == str(value):  # type: ignore[arg-type]
                calls["unchanged"] += 1
            real_update(row, column, value, **kwargs)  # type: ignore[arg-type]

        table.clear = clear  # type: ignore[method-assign]
        table.add_row = add_row  # type: ignore[method-assign]
        table.update_cell = update_cell  # type: ignore[method-assign]
        keys = {k.value: k for k in table.rows}
        start = app.refreshes
        await wait_until(pilot, lambda: app.refreshes >= start + 4, "four more refreshes")
        await settle(pilot, app, 0)
        assert calls["clear"] == 0 and calls["add_row"] == 0
        assert calls["update_cell"] > 0 and calls["unchanged"] == 0  # only cells whose text changed
        assert all(keys[k.value] is k for k in table.rows)  # the very same row keys
